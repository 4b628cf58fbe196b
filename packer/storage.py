"""Storage: local paths and fsspec URLs (``file://``, ``s3://``, ...) for built versions.

Builds always run in a local folder. When the output is a URL, the finished version folder
is published (:func:`packer.pipeline.publish.publish_version`) through :class:`VersionFolder`:
the shards and tables first, each checked after upload, and ``manifest.json`` last, so a
remote folder without a manifest is never taken for a dataset. Readers (``packer verify``,
:class:`packer.loader.ShardDataset`) open remote versions through :class:`VersionFolder` and :func:`filesystem_for`.

Where a store is configured: the environment first (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, ``AWS_ENDPOINT_URL`` and ``AWS_DEFAULT_REGION``
are read by botocore under s3fs), then explicit storage options (``--storage-option
KEY=VALUE`` on the command line, ``storage_options={...}`` in Python), merged in one place:
:func:`storage_options_for`. A ``file://`` URL is a local path: nothing goes through fsspec.

fsspec and the filesystem packages are imported only when a URL is used; ``s3://`` needs
the ``s3`` extra (``pip install 'packer[s3]'``, which brings s3fs). Raw inputs given as URLs
are listed and fetched by :mod:`packer.pipeline.rawstore` through the same functions and options.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import json
import os
import re
import reprlib
import shutil
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any
from urllib.parse import unquote, urlsplit

from packer.errors import ConfigError, PackerError, a_type, surface
from packer.files import TMP_SUFFIX, clone_file

WORK_DIR_ENV = "PACKER_WORK_DIR"
CACHE_FOLDER = "cache"           # build caches live in <work_dir>/cache/<name>-<digest>/
MANIFEST_FILE = "manifest.json"  # the one definition; packer.manifest imports it from here
#: Files of a version folder that name raw paths (README: "local only"); never uploaded by default.
LOCAL_ONLY = ("bad_samples.jsonl", "excluded.jsonl", "leakage.json", "report.html", "warnings.jsonl")
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+)://")
#: fsspec's chained URLs: ``simplecache::s3://b/p`` (a layer before the URL) or ``zip://m.csv::s3://b/a.zip``
#: (a URL inside another); a key holding ``::`` (``s3://b/a::b``) is not one. A slash of the last ``://`` may be
#: missing: a Path made of the URL (``--out`` in Python) folds ``//``
_CHAINED = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+(?:://.*?)?::(?:[A-Za-z][A-Za-z0-9+.-]+::)*[A-Za-z][A-Za-z0-9+.-]+:/",
                      re.DOTALL)
_EXTRAS = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs"}
_CHUNK = 1 << 20

Location = str | os.PathLike[str]


# -- locations --------------------------------------------------------------------------
def is_url(location: object) -> bool:
    """True for a string of the form ``scheme://...`` (``file://`` included) or an fsspec chained
    URL (``simplecache::s3://...``, which :func:`local_path` refuses); paths are not URLs."""
    return isinstance(location, str) and (_URL.match(location) is not None or _CHAINED.match(location) is not None)


def local_path(location: Location) -> Path | None:
    """The local path of a plain path or a ``file://`` URL; ``None`` for any other URL.

    Raises ``ConfigError`` for a ``file://`` URL naming another host, and for an fsspec chained
    URL (``simplecache::s3://bucket/p``): packer names, joins, lists and publishes plain URLs;
    and for anything that is no path or URL at all (a number, bytes, a list), which pathlib
    refused with a bare TypeError naming neither the value nor the fix.
    """
    if not isinstance(location, str | os.PathLike) or not isinstance(os.fspath(location), str):
        given, its = reprlib.repr(location), getattr(location, "location", None)
        also = f"; pass its .location ({reprlib.repr(its)})" if isinstance(its, str) else ""
        raise ConfigError(f"{given}: a dataset's location is a path or a URL (a str or an os.PathLike of one), not "
                          f"{a_type(location)}{also}")
    _refuse_chained(location)
    if not is_url(location):
        return Path(location)
    parts = urlsplit(str(location))
    if parts.scheme.lower() not in ("file", "local"):
        return None
    if parts.netloc not in ("", "localhost"):
        raise ConfigError(f"{location}: a file:// URL names a local path (file:///abs/path); "
                          f"host {parts.netloc!r} is not this machine")
    return Path(unquote(parts.path))


def _refuse_chained(location: Location) -> None:
    """Raise ``ConfigError`` for an fsspec chained URL, naming the plain URL to give instead."""
    if _CHAINED.match(str(location)) is not None:
        plain = re.sub(r"^([^:/]+):/+", r"\1://", str(location).rsplit("::", 1)[1])
        raise ConfigError(f"{location} is an fsspec chained URL (a::b://...), which packer does not read or write; "
                          f"give the plain URL ({plain}) and the store's options, caching ones included, as "
                          f"{surface().storage_options(KEY='VALUE')}: packer fetches each raw file once and keeps "
                          "its decodes in the build cache itself")


def join_url(base: str, *names: str) -> str:
    """``base`` and ``names`` joined with single slashes (``s3://b/p/`` + ``a`` → ``s3://b/p/a``)."""
    return "/".join([base.rstrip("/"), *(n.strip("/") for n in names)])


def manifest_url(location: str) -> str:
    """The manifest URL for a manifest URL or its version folder's URL.

    A URL ending in ``.json`` is taken as the manifest itself; anything else as the folder
    (no request is made to tell them apart).
    """
    return location if location.endswith(".json") else join_url(location, MANIFEST_FILE)


def work_dir(override: Path | None = None) -> Path:
    """Local folder for builds whose output is a URL, and for every build's cache:
    ``override``, else ``$PACKER_WORK_DIR``, else ``~/.cache/packer/work``. It holds
    ``<name>/<version>/`` of URL outputs and ``cache/<name>-<digest>/`` (:func:`build_cache_dir`)."""
    if override is not None:
        return Path(override)
    env = os.environ.get(WORK_DIR_ENV)
    return Path(env) if env else Path.home() / ".cache" / "packer" / "work"


def build_cache_dir(name: str, location: str, base: Path | None = None, *, work: Path | None = None) -> Path:
    """The build cache folder of the job ``name`` building into ``location`` (the resolved local
    output folder, or the output URL): ``<base>/<name>-<digest>/``, absolute.

    ``base`` defaults to ``<work_dir(work)>/cache``. ``digest`` is the first 12 hex digits of
    sha256(``location`` + newline + ``name``), so two jobs, or one job built into two outputs,
    never share a cache folder (a build prunes the entries it did not use), while rebuilding
    the same job into the same output finds its cache again. The folder's name holds only
    the job's name and the digest: the cache's raw paths and ids never reach a file name.
    """
    # surrogateescape: a byte of a path that is not UTF-8 (Python's \udce9 for a Latin-1 0xE9) hashes as that
    # byte; any other path gives the UTF-8 bytes, and so the digest, it always gave
    digest = hashlib.sha256(f"{location}\n{name}".encode("utf-8", "surrogateescape")).hexdigest()[:12]
    root = Path(base).expanduser() if base is not None else work_dir(work) / CACHE_FOLDER
    return root.resolve() / f"{name}-{digest}"


def resolve_output(target: Location, work: Path | None = None) -> tuple[Path, str | None]:
    """Where a build writes locally, and the URL to publish to (``None`` for a local output).

    A plain path or a ``file://`` URL is built in place; any other URL is built under
    :func:`work_dir` and published there afterwards.
    """
    try:
        _refuse_chained(target)
    except ConfigError as err:
        raise ConfigError(f"output: {err}") from err
    path = local_path(target)
    if path is not None:
        typo = _URL_TYPO.match(str(target))
        if typo is not None:  # s3:/bucket or s3//bucket: a URL with a slash missing, not a folder named "s3:"
            raise ConfigError(f"output {str(target)!r} looks like a {typo['scheme']}:// URL with a slash missing; "
                              f"write {typo['scheme']}://BUCKET/PREFIX to publish there, or ./{target} for a local "
                              "folder")
        return path.resolve(), None
    parts = urlsplit(str(target))
    if not parts.netloc:
        raise ConfigError(f"output {str(target)!r} names no bucket; write {parts.scheme}://BUCKET/PREFIX")
    return work_dir(work).resolve(), str(target)


#: A local path that is a URL with a slash missing: ``s3:/bucket``, ``s3//bucket``, ``gs:bucket``
_URL_TYPO = re.compile(r"^(?P<scheme>s3|s3a|gs|gcs|az|abfs|http|https)(?::/?(?!/)|//)")


# -- options and filesystems --------------------------------------------------------------
def parse_storage_options(pairs: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` strings (``--storage-option``, or ``storage_options=[...]`` in Python) as a
    storage-options dict.

    A VALUE that parses as JSON (``true``, ``3``, ``{"a": 1}``) is used as parsed, anything
    else as a string. Dotted keys nest: ``client_kwargs.region_name=eu-west-1`` gives
    ``{"client_kwargs": {"region_name": "eu-west-1"}}``. Raises ``ConfigError`` for a pair
    without ``=``, naming the option as the caller gives it (:func:`packer.errors.surface`).
    """
    python = surface().python  # named as the call takes them: storage_options=[...], not the flag
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            # the text is not repeated: a value typed without its KEY= may be a secret
            if python:
                raise ConfigError("storage_options: an option without KEY= (not shown: it may hold credentials); "
                                  "expected 'KEY=VALUE' strings, e.g. storage_options=['endpoint_url=http://127.0.0.1:"
                                  "9000'], or a mapping, "
                                  f"{surface().storage_options(endpoint_url='http://127.0.0.1:9000')}")
            raise ConfigError("--storage-option: an option without KEY= (not shown: it may hold credentials); "
                              "expected KEY=VALUE, e.g. endpoint_url=http://127.0.0.1:9000")
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        *outer, last = key.strip().split(".")
        node = options
        for part in outer:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                given = (f"storage_options entry '{key.strip()}=...'" if python
                         else f"--storage-option {key.strip()}=...")
                raise ConfigError(f"{given}: {part} is already set to a value, not a mapping")
            node = child
        node[last] = value
    return options


def storage_options_for(url: str, overrides: Mapping[str, Any] | Sequence[str] | None = None) -> dict[str, Any]:
    """The storage options for ``url``'s filesystem: the one place they are assembled.

    ``overrides`` is a dict (Python callers) or ``KEY=VALUE`` strings (the CLI). Credentials,
    region and endpoint otherwise come from the environment, which s3fs (through botocore)
    reads itself: ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` or ``AWS_PROFILE``,
    ``AWS_DEFAULT_REGION`` and ``AWS_ENDPOINT_URL`` (an S3-compatible server such as MinIO;
    ``AWS_ENDPOINT_URL_S3`` first), which is passed on as ``endpoint_url`` unless given.
    """
    if overrides is None:
        options: dict[str, Any] = {}
    elif isinstance(overrides, Mapping):
        options = dict(overrides)
    else:
        options = parse_storage_options(list(overrides))
    scheme = url.split("://", 1)[0].lower()
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if scheme in ("s3", "s3a") and endpoint and "endpoint_url" not in options \
            and "endpoint_url" not in options.get("client_kwargs", {}):
        # botocore reads it too, but fsspec caches filesystems by their arguments: passing it
        # makes a changed variable give a new filesystem instead of a cached one for the old endpoint.
        options["endpoint_url"] = endpoint
    if scheme in ("http", "https"):
        options = _with_http_timeout(options)
    return options


#: aiohttp's timeouts for http(s):// reads when the options set none: a server that accepts no
#: connection in 30 s, or sends no byte for 120 s mid-body, fails the request (an ``unreadable``
#: bad sample) instead of holding the build forever. No limit on a whole transfer: aiohttp's own
#: default (5 minutes in all) would cut a large file short on a slow link.
HTTP_TIMEOUT = {"sock_connect": 30.0, "sock_read": 120.0}


def _with_http_timeout(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` for fsspec's HTTPFileSystem, whose ``client_kwargs`` go to ``aiohttp.ClientSession``:
    ``client_kwargs.timeout`` as an ``aiohttp.ClientTimeout``, from a mapping of its fields (what
    ``--storage-option client_kwargs.timeout.sock_read=300`` gives) or :data:`HTTP_TIMEOUT` where
    none is given. Raises TypeError for a field ClientTimeout does not take (the caller names it)."""
    try:
        import aiohttp
    except ImportError:  # fsspec's http needs it: opening the filesystem says so
        return options
    client = options.get("client_kwargs")
    if client is not None and not isinstance(client, Mapping):
        return options  # the filesystem refuses it, and the caller names the option
    client = dict(client or {})
    timeout = client.get("timeout", HTTP_TIMEOUT)
    if isinstance(timeout, Mapping):
        client["timeout"] = aiohttp.ClientTimeout(**timeout)
    return {**options, "client_kwargs": client}


def filesystem_for(url: str, storage_options: Mapping[str, Any] | None = None) -> tuple[Any, str]:
    """The fsspec filesystem for ``url`` and the path it knows the URL by.

    Raises ``ConfigError`` when the protocol is unknown or its package is not installed, or the
    URL is a chained one (``simplecache::s3://...``).
    """
    _refuse_chained(url)
    try:
        import fsspec.core
    except ImportError as err:
        raise ConfigError(f"{url}: reading URLs needs fsspec: pip install 'packer[s3]'") from err
    try:
        fs, path = fsspec.core.url_to_fs(url, **storage_options_for(url, storage_options))
    except (ImportError, ValueError) as err:
        raise _protocol_error(url, err) from err
    except TypeError as err:  # an option this filesystem does not take
        raise _options_error(url, storage_options, err) from err
    # s3fs makes its client on first use: a bad option would surface mid-build. Only filesystems with
    # that connect step take it: HTTPFileSystem also has set_session (aiohttp's) but no connect().
    if hasattr(fs, "set_session") and callable(getattr(fs, "connect", None)):
        try:
            fs.connect()  # makes the client (no request); cached on the filesystem, which fsspec caches
        except (TypeError, ValueError, AttributeError) as err:  # AttributeError: client_kwargs=abc, not a mapping
            raise (_environment_error(url, storage_options, err) or _options_error(url, storage_options, err)) from err
        except remote_errors() as err:  # botocore's PartialCredentialsError: key= without secret=, or the reverse
            raise (_environment_error(url, storage_options, err) or _options_error(url, storage_options, err)) from err
    return fs, path


def check_output_store(url: str, storage_options: Mapping[str, Any] | None = None) -> None:
    """Reach the store an output URL names, with the build's options, before anything is built:
    an unreachable endpoint, missing credentials or a missing bucket is a ``ConfigError`` now,
    not after every file has been decoded into the local work folder (where the upload found it).
    One request: the URL's folder (absent is fine: the build makes it; an absent bucket is not).
    ``fs.exists`` would not do: s3fs answers False for a missing bucket as for a missing folder."""
    fs, path = filesystem_for(url, storage_options)
    try:
        fs.info(path)
    except FileNotFoundError as err:
        if missing_bucket(err):
            raise storage_error(url, err, doing="reaching the output store before building") from err
    except remote_errors() as err:
        raise storage_error(url, err, doing="reaching the output store before building") from err


def _options_error(url: str, storage_options: Mapping[str, Any] | None, err: BaseException) -> ConfigError:
    given = ", ".join(sorted(storage_options or {})) or "none"
    return ConfigError(f"{url}: the storage options (given: {given}) are not accepted ({type(err).__name__}: "
                       f"{err}); check each storage option, e.g. "
                       f"{surface().storage_options(endpoint_url='http://127.0.0.1:9000')}")


#: The environment variables botocore reads a key pair from, each with its partner.
_KEY_PAIR = {"AWS_ACCESS_KEY_ID": "AWS_SECRET_ACCESS_KEY", "AWS_SECRET_ACCESS_KEY": "AWS_ACCESS_KEY_ID"}


def _environment_error(url: str, storage_options: Mapping[str, Any] | None, err: BaseException) -> ConfigError | None:
    """The ``ConfigError`` naming the environment variable at fault when making the store's client
    failed on a value that came from the environment, not from a storage option the user gave
    (``AWS_PROFILE`` naming no profile, an ``AWS_ENDPOINT_URL`` that is no URL, half of an
    ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` pair, an ``AWS_DEFAULT_REGION`` that is no
    region name), with its fix; None where the options are to blame. Credentials are never shown."""
    given = dict(storage_options or {})
    client = given.get("client_kwargs")
    given_client = dict(client) if isinstance(client, Mapping) else {}
    fields: Mapping[str, Any] = getattr(err, "kwargs", None) or {}
    kind = type(err).__name__
    if kind == "ProfileNotFound" and "profile" not in given:
        variable = next((name for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE")
                         if os.environ.get(name) and os.environ[name] == fields.get("profile")), None)
        if variable is not None:
            config = os.environ.get("AWS_CONFIG_FILE") or "~/.aws/config"
            credentials = os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or "~/.aws/credentials"
            return ConfigError(f"{url}: the environment variable {variable} names the profile "
                               f"'{os.environ[variable]}', which does not exist ({kind}: {err}); a profile must "
                               f"exist in {config} (as [profile NAME]) or {credentials} (as [NAME]): set {variable} "
                               "to one that does, or unset it to use the default credentials")
    if kind == "PartialCredentialsError" and fields.get("provider") == "env":
        missing = str(fields.get("cred_var", ""))
        partner = _KEY_PAIR.get(missing)
        if partner is not None:
            return ConfigError(f"{url}: the environment variable {missing} is not set (or empty) but {partner} is "
                               "(its value not shown): botocore takes a key pair from the environment whole; set "
                               f"both, or neither (then AWS_PROFILE or {surface().storage_options(key='...')} and "
                               "secret=... give the credentials)")
    if kind == "InvalidRegionError" and "region_name" not in given_client:
        region = os.environ.get("AWS_DEFAULT_REGION")
        if region and region == fields.get("region_name"):
            return ConfigError(f"{url}: the environment variable AWS_DEFAULT_REGION is '{region}', not a region "
                               f"name ({kind}: {err}); set it to one, e.g. AWS_DEFAULT_REGION=us-east-1, or unset it")
    if isinstance(err, ValueError) and str(err).startswith("Invalid endpoint") \
            and "endpoint_url" not in given and "endpoint_url" not in given_client:
        variable = next((name for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL") if os.environ.get(name)), None)
        if variable is not None:
            value = os.environ[variable]
            shown = value if "@" not in value else "...@" + value.rsplit("@", 1)[-1]  # no user or password
            example = (f"{variable}=http://{shown}" if "://" not in value
                       else f"{variable}=http://HOST:PORT or https://HOST")
            return ConfigError(f"{url}: the environment variable {variable} is '{shown}', not an endpoint URL; "
                               f"an endpoint needs its scheme, http:// or https:// (e.g. {example}), or unset "
                               f"{variable} for the store's own endpoint")
    return None


def check_protocol(url: str) -> None:
    """Raise ``ConfigError`` when fsspec does not know ``url``'s protocol or the package that
    implements it is not installed, or it is a chained URL (``simplecache::s3://...``). Makes no
    request and needs no storage options."""
    _refuse_chained(url)
    try:
        import fsspec
    except ImportError as err:
        raise ConfigError(f"{url}: reading URLs needs fsspec: pip install 'packer[s3]'") from err
    try:
        fsspec.get_filesystem_class(url.split("://", 1)[0].lower())
    except (ImportError, ValueError) as err:
        raise _protocol_error(url, err) from err


def _protocol_error(url: str, err: ImportError | ValueError) -> ConfigError:
    scheme = url.split("://", 1)[0].lower()
    if isinstance(err, ImportError):
        package = _EXTRAS.get(scheme, f"the fsspec implementation of {scheme}://")
        extra = "pip install 'packer[s3]'" if package == "s3fs" else f"pip install {package}"
        return ConfigError(f"{url}: {scheme}:// URLs need {package}, which is not installed; {extra}")
    return ConfigError(f"{url}: {err}; use a local path, file://, s3:// or another fsspec protocol")


def remote_errors() -> tuple[type[BaseException], ...]:
    """Exception types a remote filesystem raises for a defect of the store or the network.

    s3fs turns most S3 errors into ``OSError`` subclasses (``FileNotFoundError`` for a
    missing bucket or key, ``PermissionError`` for access denied), but botocore's own
    errors (no credentials, endpoint unreachable) pass through, as do aiohttp's under fsspec's
    http(s):// filesystem (an HTTP error status other than 404, a body cut short).
    """
    errors: list[type[BaseException]] = [OSError, asyncio.TimeoutError]
    with contextlib.suppress(ImportError):
        from botocore.exceptions import BotoCoreError, ClientError

        errors += [BotoCoreError, ClientError]
    with contextlib.suppress(ImportError):
        # fsspec's http(s):// filesystem passes aiohttp's errors on: a status it does not turn into
        # FileNotFoundError (a 500, a 403) is ClientResponseError, a body cut short ClientPayloadError
        from aiohttp import ClientError as HTTPClientError

        errors.append(HTTPClientError)
    return tuple(errors)


class RemoteStoreError(OSError):
    """A store error that is not an ``OSError`` (botocore's), as an ``OSError`` whose message
    says what to fix; ``cause`` is the original."""

    def __init__(self, message: str, *, cause: BaseException) -> None:
        super().__init__(message)
        self.cause = cause


#: How stores word a missing bucket: S3 and S3-compatible servers (s3fs passes on "The specified
#: bucket does not exist", code NoSuchBucket), GCS ("bucket not found"), others "no such bucket".
_MISSING_BUCKET = re.compile(r"bucket does not exist|nosuchbucket|bucket not found|no such bucket", re.IGNORECASE)


def missing_bucket(err: BaseException) -> bool:
    """True when ``err`` says the bucket itself does not exist. Not the word "bucket" anywhere:
    a missing key's FileNotFoundError carries its path, and bucket names often hold the word."""
    return isinstance(err, FileNotFoundError) and _MISSING_BUCKET.search(str(err)) is not None


def describe_error(url: str, err: BaseException) -> str:
    """What went wrong at ``url`` and how to fix it, for a remote error."""
    if isinstance(err, RemoteStoreError):
        return str(err)
    text = str(err) or type(err).__name__
    name = type(err).__name__
    if missing_bucket(err):
        return (f"{url}: the bucket does not exist ({text}); create it (e.g. `aws s3 mb s3://BUCKET`) "
                "or fix the URL")
    if isinstance(err, FileNotFoundError):
        return f"{url}: not found ({text})"
    if isinstance(err, PermissionError) or "AccessDenied" in text or "Forbidden" in text:
        return (f"{url}: access denied ({text}); check the credentials (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY "
                f"or AWS_PROFILE, or {surface().storage_options(key='...', secret='...')}) and the bucket policy")
    if name in ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"):
        return (f"{url}: no usable credentials ({text}); set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                f"(or AWS_PROFILE), or pass {surface().storage_options(anon='true')} for a public bucket")
    if "Connect" in name or "Endpoint" in name or isinstance(err, ConnectionError | TimeoutError):
        return (f"{url}: cannot reach the object store ({text}); check the network and the endpoint "
                f"(AWS_ENDPOINT_URL or {surface().storage_options(endpoint_url='http://HOST:PORT')})")
    return f"{url}: {name}: {text}"


def storage_error(url: str, err: BaseException, *, doing: str) -> PackerError:
    """A project error for a remote failure while ``doing`` something, chained by the caller.

    Missing buckets, credentials, permissions and unreachable endpoints are configuration
    (``ConfigError``, exit 2); anything else is a failed run (``PackerError``).
    """
    message = f"{doing}: {describe_error(url, err)}"
    err = err.cause if isinstance(err, RemoteStoreError) else err
    configish = (isinstance(err, PermissionError | ConnectionError | TimeoutError)
                 or missing_bucket(err)
                 or "Credential" in type(err).__name__ or "Endpoint" in type(err).__name__)
    return ConfigError(message) if configish else PackerError(message)


def cancel_remote_requests(timeout: float = 5.0) -> None:
    """Cancel the requests still running on fsspec's event loop, and wait (up to ``timeout``
    seconds) until they have unwound: for a Ctrl-C that lands while the main thread waits on one.

    fsspec runs every request as a task on a loop in its own thread; a KeyboardInterrupt in the
    main thread leaves the task running, and at interpreter exit it is collected half done:
    asyncio prints "Task was destroyed but it is pending!" and botocore a traceback over packer's
    one "interrupted" line. Nothing to do when fsspec was never used."""
    asyn = sys.modules.get("fsspec.asyn")
    loop = None if asyn is None else getattr(asyn, "loop", [None])[0]
    if loop is None or loop.is_closed() or not loop.is_running():
        return

    async def cancel_all() -> None:
        tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    try:
        asyncio.run_coroutine_threadsafe(cancel_all(), loop).result(timeout)
    except concurrent.futures.TimeoutError:  # a request that ignores cancellation: exit anyway, it cannot publish
        return


# -- a version folder, local or remote ------------------------------------------------------
#: The part sizes a multipart upload of a shard may have used: s3fs's default (50 MiB, unless the
#: file needs more than 10,000 parts), and the AWS CLI's and boto3's (8 MiB)
_PART_SIZES = (50 << 20, 8 << 20)
_MAX_PARTS = 10_000


def _md5(data: bytes = b"") -> Any:
    """MD5, as S3 ETags use it: a checksum here, not security (so FIPS builds allow it)."""
    return hashlib.md5(data, usedforsecurity=False)


def etag_matches(etag: str | None, path: Path) -> bool:
    """True when the store's ``etag`` of an object proves it holds the bytes of the local file
    ``path``: the ETag is their MD5 (a single-part upload or a copy), or the MD5 of the MD5s of
    their parts for a multipart upload of a part size :data:`_PART_SIZES` gives (or the one s3fs
    picks for a file over 10,000 parts). False proves nothing: no ETag, another part size, or an
    ETag that is not an MD5 (SSE-KMS, other stores); read the object back to decide. Reads
    ``path`` once per candidate part size (MD5 runs at ~600 MB/s on one core)."""
    if not etag:
        return False
    size = path.stat().st_size
    head, _, parts = etag.partition("-")
    if not parts:
        with open(path, "rb") as fh:
            return hashlib.file_digest(fh, _md5).hexdigest() == head
    if not parts.isdigit():
        return False
    count = int(parts)
    sizes = {-(-size // _MAX_PARTS) if size > _MAX_PARTS * part else part for part in _PART_SIZES}
    for part in sorted(sizes):
        if -(-size // part) != count:
            continue
        digests = bytearray()
        with open(path, "rb") as fh:
            while block := fh.read(part):
                digests += _md5(block).digest()
        if _md5(bytes(digests)).hexdigest() == head:
            return True
    return False


def _etag(entry: Mapping[str, Any]) -> str | None:
    """The ETag of an fsspec listing entry without its quotes; None where the store gives none."""
    value = entry.get("ETag", entry.get("etag"))
    return value.strip('"') if isinstance(value, str) and value.strip('"') else None


class VersionFolder:
    """A dataset version folder addressed by a local path or a URL; names are relative to it.

    Local folders use plain ``pathlib``/``open``; remote ones go through fsspec. Every
    method raises ``FileNotFoundError`` for a missing file and ``OSError`` (with a message
    from :func:`describe_error`) for any other failure, whatever the store.
    """

    def __init__(self, location: Location, storage_options: Mapping[str, Any] | None = None) -> None:
        self.local = local_path(location)
        self.url = str(location).rstrip("/") if self.local is None else str(self.local)
        self._fs: Any = None
        self._root = ""
        if self.local is None:
            self._fs, self._root = filesystem_for(self.url, storage_options)
            self._root = self._root.rstrip("/")

    def where(self, name: str = "") -> str:
        """The folder (``name=""``) or one of its files, as a user would type it."""
        if self.local is not None:
            return str(self.local / name) if name else str(self.local)
        return join_url(self.url, name) if name else self.url

    def _remote(self, name: str) -> str:
        return f"{self._root}/{name}"

    @contextlib.contextmanager
    def _translated(self, name: str) -> Iterator[None]:
        try:
            yield
        except OSError:
            raise
        except remote_errors() as err:
            raise RemoteStoreError(describe_error(self.where(name), err), cause=err) from err

    def size(self, name: str) -> int:
        """Size in bytes of ``name``."""
        with self._translated(name):
            if self.local is not None:
                return (self.local / name).stat().st_size
            self._fs.invalidate_cache(self._remote(name))  # a cached listing may describe a replaced object
            info = self._fs.info(self._remote(name))
            if info.get("type") != "file":
                raise FileNotFoundError(f"{self.where(name)} is not a file")
            return int(info["size"])

    @contextlib.contextmanager
    def open(self, name: str) -> Iterator[IO[bytes]]:
        """``name`` opened for binary reading (seekable; remote files read ahead in blocks)."""
        with self._translated(name):
            if self.local is not None:
                with open(self.local / name, "rb") as fh:
                    yield fh
            else:
                with self._fs.open(self._remote(name), "rb") as fh:
                    yield fh

    def read_bytes(self, name: str) -> bytes:
        """All bytes of ``name``."""
        with self.open(name) as fh:
            with self._translated(name):
                return fh.read()

    def sha256(self, name: str) -> tuple[int, str]:
        """Size and sha256 of ``name``, read once in 1 MiB blocks (a loop, not ``hashlib.file_digest``,
        which needs ``readinto``: not every fsspec file has it)."""
        digest = hashlib.sha256()
        size = 0
        with self.open(name) as fh:
            with self._translated(name):
                while block := fh.read(_CHUNK):
                    digest.update(block)
                    size += len(block)
        return size, digest.hexdigest()

    def files(self) -> list[str]:
        """Names of the plain files directly inside the folder, sorted."""
        return sorted(self.sizes())

    def sizes(self) -> dict[str, int]:
        """Size of each plain file directly inside the folder, by name: one listing."""
        return {name: size for name, (size, _) in self.listing().items()}

    def listing(self) -> dict[str, tuple[int, str | None]]:
        """Size and ETag (quotes stripped) of each plain file directly inside the folder, by name:
        one listing. The ETag is None where the store gives none (a local folder, some stores);
        on S3 it is the MD5 of the bytes for a single-part upload or copy, ``<md5 of the parts'
        MD5s>-<parts>`` for a multipart one, and neither under SSE-KMS (:func:`etag_matches`)."""
        with self._translated(""):
            if self.local is not None:
                return {p.name: (p.stat().st_size, None) for p in self.local.iterdir() if p.is_file()}
            self._fs.invalidate_cache(self._root)
            entries = self._fs.ls(self._root, detail=True)
            return {e["name"].rstrip("/").rsplit("/", 1)[-1]: (int(e.get("size") or 0), _etag(e))
                    for e in entries if e.get("type") == "file"}

    # Writing is for publishing (packer.pipeline.publish) only; errors are not translated.
    def upload(self, sources: list[Path], names: list[str]) -> None:
        if self.local is not None:
            self.local.mkdir(parents=True, exist_ok=True)
            for source, name in zip(sources, names, strict=True):
                partial = self.local / (name + TMP_SUFFIX)
                shutil.copyfile(source, partial)
                os.replace(partial, self.local / name)
            return
        if sources:  # lists on both sides: fsspec takes each name as it is, never as a glob pattern
            self._fs.put([str(s) for s in sources], [self._remote(n) for n in names])
        self._fs.invalidate_cache(self._root)

    def folders(self) -> list[str]:
        """Names of the folders directly inside this one, sorted (none where it does not exist)."""
        with self._translated(""):
            if self.local is not None:
                return sorted(p.name for p in self.local.iterdir() if p.is_dir()) if self.local.is_dir() else []
            try:
                self._fs.invalidate_cache(self._root)
                entries = self._fs.ls(self._root, detail=True)
            except FileNotFoundError:
                return []
            return sorted(e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries if e.get("type") == "directory")

    def copy_from(self, source: VersionFolder, source_name: str, name: str) -> bool:
        """Copy ``source``'s file ``source_name`` to ``name`` here inside the store, without its
        bytes passing through this machine (S3 CopyObject, GCS rewrite; a local folder links or
        copies it, :func:`packer.files.clone_file`). False, and nothing done, where the two
        folders are not on one store."""
        if self.local is not None and source.local is not None:
            self.local.mkdir(parents=True, exist_ok=True)
            clone_file(source.local / source_name, self.local / name)
            return True
        if self.local is not None or source.local is not None or type(self._fs) is not type(source._fs):
            return False
        # cp_file: one object to one key; fs.copy takes its paths for glob patterns (a prefix
        # ``exp[1]`` or ``q?x``, legal in a key, matched nothing or copied into <name>/<name>)
        self._fs.cp_file(source._remote(source_name), self._remote(name))
        self._fs.invalidate_cache(self._root)
        return True

    def remove(self, name: str) -> None:
        if self.local is not None:
            (self.local / name).unlink(missing_ok=True)
            return
        self._fs.rm_file(self._remote(name))
        self._fs.invalidate_cache(self._root)
