"""``packer key new FILE``: make a PHI pseudonymization key, readable by its owner only."""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import subprocess
from pathlib import Path

import click

from packer.commands import exits
from packer.errors import ConfigError, blocking_file, refused_write, uncreatable

#: Random bytes in a new key (written as twice as many hex characters).
KEY_BYTES = 32

_PLAIN_YAML = re.compile(r"[A-Za-z0-9_./~-]+")


@click.group("key")
def key_command() -> None:
    """PHI keys: the secret that turns entity ids and file paths into pseudonyms.

    \b
    A job with a DICOM source pseudonymizes by default and needs a key:
      packer key new phi.key        # a random key in phi.key, readable by you only
    then either name it in the job (a relative path is relative to the job file)
      phi: {key_file: phi.key}
    or export it (not both with different keys: that is an error, exit 2)
      export PACKER_PHI_KEY=$(cat phi.key)

    Keep the key out of the repository, and keep it: the pseudonyms, the split and the
    dataset_hash depend on it, so rebuilding a dataset needs the key it was built with.
    """


@key_command.command("new")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--force", is_flag=True,
              help="Replace FILE if it exists. The old key is lost, and with it the way to rebuild the "
                   "datasets made with it: pseudonyms, split and dataset_hash all change.")
@exits
def new_command(file: Path, force: bool) -> None:
    """Write a new random PHI key (64 hex characters) to FILE, readable and writable by you only
    (mode 0600), creating its folders, and print the lines that put it to use.

    Never overwrites an existing FILE (exit 2) unless --force.
    """
    from packer.phi import ENV_KEY, Pseudonymizer

    key = secrets.token_hex(KEY_BYTES)
    _write_key(file, (key + "\n").encode(), force=force)
    fingerprint = Pseudonymizer(mode="pseudonymize", dates="shift", key=key.encode()).fingerprint
    typed, absolute = str(file), str(file.resolve())
    yaml_path = absolute if _PLAIN_YAML.fullmatch(absolute) else json.dumps(absolute)
    click.echo("\n".join([
        f"wrote a new PHI key to {typed} (mode 0600, fingerprint {fingerprint}; manifests record this fingerprint)",
        "use it in the job file (this absolute path works from any job file; a relative key_file is "
        "relative to the job file, not to this folder):",
        f"  phi: {{key_file: {yaml_path}}}",
        "or in the environment (not both with different keys: that is an error):",
        f"  export {ENV_KEY}=$(cat {shlex.quote(typed)})",
        f"{_repository_note(file)}, and keep it: the pseudonyms, the split and the dataset_hash depend on it, so "
        "rebuilding a dataset needs the key it was built with",
    ]))


def _repository_note(path: Path) -> str:
    """What to do about git: nothing where the key is in a repository that ignores it, add it to
    .gitignore where the repository would track it, and the general rule elsewhere."""
    try:
        checked = subprocess.run(["git", "check-ignore", "-q", path.name], cwd=path.parent, capture_output=True,
                                 timeout=10)
    except (OSError, subprocess.SubprocessError):  # no git here
        return "keep it out of any repository"
    if checked.returncode == 0:
        return "git ignores it here; keep it out of the repository"
    if checked.returncode == 1:
        return "this git repository would track it: add it to .gitignore"
    return "keep it out of any repository"  # 128: not in a repository


def _make_folder(path: Path) -> None:
    """Create the folder of the key file ``path``; a ConfigError naming what is in the way (a
    link to a folder that is not there: a volume not mounted) or why it cannot be made."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        # "exists" where no file is in the way (checked before): a link that leads nowhere is
        broken = next((p for p in (path.parent, *path.parent.parents) if p.is_symlink() and not p.exists()),
                      None) if isinstance(err, FileExistsError) else None
        if broken is not None:
            raise ConfigError(f"{broken} is a link to {os.readlink(broken)}, which does not exist (a volume not "
                              f"mounted?), so {path} cannot be created under it; mount or fix the link, or choose "
                              "another FILE") from err
        refused = (refused_write(err, path.parent, opening=True, elsewhere="choose another FILE")
                   or uncreatable(err, path, elsewhere="choose another FILE"))  # /proc takes no folder
        if refused is not None:
            raise refused from err
        raise ConfigError(f"cannot create the folder {path.parent} ({err.strerror or err}); choose another "
                          "FILE") from err


def _write_key(path: Path, data: bytes, *, force: bool) -> None:
    """Create ``path`` with mode 0600 and write ``data``; never follow into an existing file.

    Without ``force`` an existing ``path`` is a ConfigError. With ``force`` the key goes to a new
    file next to it (mode 0600 from its creation) that then replaces ``path``, so an existing
    file's looser mode is not inherited and a failed write leaves the old key in place.
    """
    if path.is_dir():
        raise ConfigError(f"{path} is a folder; name the key file to create, e.g. {path / 'phi.key'}")
    blocker = blocking_file(path.parent)
    if blocker is not None:  # mkdir would fail with "File exists" or "Not a directory"
        raise ConfigError(f"{blocker} is a file, not a folder, so {path} cannot be created under it; choose "
                          "another FILE")
    if path.exists() and not force:
        raise ConfigError(f"{path} already exists; packer key new never overwrites a key, because datasets built "
                          "with it need it to be rebuilt identically. Choose another FILE, or pass --force to "
                          "replace it")
    target = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp") if force else path
    _make_folder(path)
    try:
        fd = os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            if force:
                os.replace(target, path)
        except BaseException:
            target.unlink(missing_ok=True)
            raise
    except FileExistsError as err:  # created by someone else since the check above
        raise ConfigError(f"{path} already exists; choose another FILE, or pass --force to replace it") from err
    except OSError as err:
        refused = (refused_write(err, path, opening=True, elsewhere="choose another FILE")
                   or uncreatable(err, path, elsewhere="choose another FILE"))  # /proc takes no file
        if refused is None:
            raise
        raise refused from err
