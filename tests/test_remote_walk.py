"""Walking a URL root finds what walking the same tree on local disk finds: folders (and the
zero-byte objects that stand for them) are never files, a root that names one object is
refused as a file is, and a label table's cells name objects under the root as a local
table's paths name files under a local root."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from packer.pipeline.discover import discover
from packer.pipeline.rawstore import list_remote_files
from tests.s3_store import Store, running_store
from tests.test_remote_keys import job_for, png_bytes

pytestmark = pytest.mark.slow  # every test talks to moto's S3 server
pytest.importorskip("moto.server", reason="moto[server] (the dev extra) runs the local S3 server")
pytest.importorskip("s3fs", reason="s3fs (the s3 extra) reads s3:// URLs")

BUCKET = "walk"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    with running_store(tmp_path_factory.mktemp("aws"), BUCKET) as running:
        yield running



def test_folder_marker_objects_are_folders_not_empty_files(store: Store, tmp_path: Path) -> None:
    """``ct/pat0/`` (a zero-byte object whose key ends in ``/``, as the S3 console's "Create
    folder" and sync tools write) is a folder: it is neither listed nor excluded as an empty
    file, and a folder holding only its marker holds no file."""
    for patient in range(3):
        store.client.put_object(Bucket=BUCKET, Key=f"markers/pat{patient}/", Body=b"")
        store.client.put_object(Bucket=BUCKET, Key=f"markers/pat{patient}/IM0001",
                                Body=b"\0" * 128 + b"DICM" + b"rest")
    store.client.put_object(Bucket=BUCKET, Key="markers/", Body=b"")
    store.client.put_object(Bucket=BUCKET, Key="markers/empty/", Body=b"")
    listed = list_remote_files(f"s3://{BUCKET}/markers")
    assert [f.relpath for f in listed] == ["pat0/IM0001", "pat1/IM0001", "pat2/IM0001"]
    found = discover(job_for(tmp_path, {"kind": "dicom", "name": "ct", "root": f"s3://{BUCKET}/markers"}))
    assert [e.path for e in found.excluded if not e.path.endswith("IM0001")] == []


@pytest.mark.parametrize(("variables", "named", "fix"), [
    ({"AWS_PROFILE": "nosuchprofile"}, "AWS_PROFILE", "a profile must exist in "),
    ({"AWS_ENDPOINT_URL": "minio.local:9000"}, "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL=http://minio.local:9000"),
    ({"AWS_ENDPOINT_URL_S3": "minio.local:9000", "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}, "AWS_ENDPOINT_URL_S3",
     "AWS_ENDPOINT_URL_S3=http://minio.local:9000"),
    ({"AWS_ACCESS_KEY_ID": "AKIAENVONLYSECRET"}, "AWS_SECRET_ACCESS_KEY", "set both, or neither"),
    ({"AWS_DEFAULT_REGION": "us east 1"}, "AWS_DEFAULT_REGION", "e.g. AWS_DEFAULT_REGION=us-east-1"),
])
def test_a_bad_aws_variable_is_named_as_the_setting_at_fault_not_the_storage_options_never_given(
        monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], named: str, fix: str) -> None:
    """The user gave no storage option: the message names the environment variable whose value
    botocore refused and how to fix it, and never shows a credential's value."""
    s3fs = pytest.importorskip("s3fs")
    from packer.errors import ConfigError
    from packer.storage import filesystem_for

    for name in ("AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL",
                 "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    s3fs.S3FileSystem.clear_instance_cache()  # an instance connected under other variables would not connect again
    with pytest.raises(ConfigError) as err:
        filesystem_for("s3://bkt/photos")
    message = str(err.value)
    assert message.startswith("s3://bkt/photos: ")
    assert f"environment variable {named}" in message and fix in message, message
    assert "storage options (given: none)" not in message and "AKIAENVONLYSECRET" not in message


def test_a_bad_storage_option_is_still_blamed_on_the_option_even_with_aws_variables_set(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An endpoint given as ``--storage-option endpoint_url=...`` is the option's fault, not the
    variable's, whatever the environment holds."""
    pytest.importorskip("s3fs")
    from packer.errors import ConfigError
    from packer.storage import filesystem_for

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    with pytest.raises(ConfigError, match=r"the storage options \(given: endpoint_url\) are not accepted") as err:
        filesystem_for("s3://bkt/photos", {"endpoint_url": "minio.local:9000"})
    assert "environment variable" not in str(err.value)


def test_a_root_naming_one_object_is_refused_as_an_object_naming_its_folder(store: Store, tmp_path: Path) -> None:
    """``root: s3://…/cat/i1.png`` (an object's URL pasted as the root) is refused as a local
    root that is a file is ("is a file, not a folder"), naming the folder to give instead: not
    "no image files under" a URL that is an image file."""
    from packer.errors import ConfigError

    store.client.put_object(Bucket=BUCKET, Key="pasted/cat/i1.png", Body=png_bytes(1))
    root = f"s3://{BUCKET}/pasted/cat/i1.png"
    job = job_for(tmp_path, {"kind": "image", "name": "cats", "root": root, "label": "folder"})
    with pytest.raises(ConfigError) as err:
        discover(job)
    message = str(err.value)
    assert f"sources.cats.root: {root} is an object, not a folder" in message, message
    assert f"s3://{BUCKET}/pasted/cat" in message.split("not a folder", 1)[1] and "no image files" not in message
    # an object that is also a prefix (``a.png`` beside ``a.png/b.png``) is a folder as well: its files are listed
    store.client.put_object(Bucket=BUCKET, Key="both/a.png", Body=png_bytes(2))
    store.client.put_object(Bucket=BUCKET, Key="both/a.png/b.png", Body=png_bytes(3))
    assert [f.relpath for f in list_remote_files(f"s3://{BUCKET}/both/a.png")] == ["b.png"]


def test_table_cells_that_are_urls_under_the_url_root_name_their_objects(store: Store, tmp_path: Path) -> None:
    """A labels table whose path cells are the objects' full URLs (as ``aws s3 ls`` or fsspec's
    glob writes them) names the objects under a URL root, as absolute paths under a local root
    name their files: also written with a doubled slash or beside relative cells. A URL on
    another store or bucket is a ``missing_file`` quoting the cell as written, outside the root;
    one elsewhere in the root's bucket leaves the root (``outside_root``), as an absolute local
    path outside a local root does."""
    for i in range(4):
        store.client.put_object(Bucket=BUCKET, Key=f"urls/photos/i{i}.png", Body=png_bytes(10 + i))
    rows = [f"s3://{BUCKET}/urls/photos/i0.png,a,e0,2024-01-01", "i1.png,b,e1,2024-01-01",
            f"s3://{BUCKET}/urls//photos/i2.png,a,e2,2024-01-01", f"S3://{BUCKET}/urls/photos/i3.png,b,e3,2024-01-01",
            "s3://other-bucket/urls/photos/i9.png,a,e9,2024-01-01",
            f"s3://{BUCKET}/elsewhere/i8.png,b,e8,2024-01-01"]
    table = "\n".join(["path,label,entity,timestamp", *rows]) + "\n"
    store.client.put_object(Bucket=BUCKET, Key="urls/labels.csv", Body=table.encode())
    job = job_for(tmp_path, {"kind": "image", "name": "ph", "root": f"s3://{BUCKET}/urls/photos/",
                             "table": f"s3://{BUCKET}/urls/labels.csv"})
    found = discover(job)
    assert sorted((r.relpath, r.label) for r in found.refs) == [
        ("i0.png", "a"), ("i1.png", "b"), ("i2.png", "a"), ("i3.png", "b")]
    assert found.unlabeled == {}
    issues = {i.reason: i.message for i in found.issues}
    assert sorted(issues) == ["missing_file", "outside_root"], issues
    assert "'s3://other-bucket/urls/photos/i9.png'" in issues["missing_file"]
    assert "outside the source root" in issues["missing_file"] and "s3:/other" not in issues["missing_file"]
    assert f"'s3://{BUCKET}/elsewhere/i8.png'" in issues["outside_root"]


def test_a_table_of_urls_only_under_the_url_root_is_not_a_table_that_matches_nothing(
        store: Store, tmp_path: Path) -> None:
    """Every cell a URL under the root: the table matches, where it was a config error advising
    a path_base that no value of could make the URLs match."""
    for i in range(2):
        store.client.put_object(Bucket=BUCKET, Key=f"only-urls/i{i}.png", Body=png_bytes(20 + i))
    table = "path,label,entity,timestamp\n" + "".join(
        f"s3://{BUCKET}/only-urls/i{i}.png,a,e{i},2024-01-01\n" for i in range(2))
    store.client.put_object(Bucket=BUCKET, Key="only-urls-labels.csv", Body=table.encode())
    job = job_for(tmp_path, {"kind": "image", "name": "ph", "root": f"s3://{BUCKET}/only-urls",
                             "table": f"s3://{BUCKET}/only-urls-labels.csv"})
    found = discover(job)
    assert sorted(r.relpath for r in found.refs) == ["i0.png", "i1.png"] and found.issues == []


@pytest.mark.parametrize(("cell", "root", "rel"), [
    ("http://host/data%20set/photos/i0.png", "http://host/data%20set/photos/", "i0.png"),
    ("http://host/data%20set/photos/i0.png", "http://host/data set/photos", "i0.png"),
    ("https://HOST/a/b%2Bc.png?sig=1", "https://host/a", "b+c.png"),
    ("s3://bkt/data%20set/i0.png", "s3://bkt/data%20set", "i0.png"),  # an s3 key's %20 is literal, both sides
])
def test_a_url_cell_under_a_percent_encoded_http_root_names_its_file(cell: str, root: str, rel: str) -> None:
    """Under an http(s) root both the cell's and the root's paths are read as the listing names
    them (percent-decoded): the root's data%20set is the folder 'data set' the cells' paths hold."""
    from packer.pipeline.tables import _rebase_url

    assert _rebase_url(cell, root) == rel
