"""The client's columnar records (samples and discovery's refs): the same records back, whatever they hold."""

from __future__ import annotations

import dataclasses
import gc
import importlib
import pickle
import tracemalloc
import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.files import canonical_json
from packer.pipeline.sampletable import RefTable, SampleTable, TableBuilder, as_table
from packer.pipeline.spill import _sample_json
from packer.records import SampleRef, SpilledSample

text = st.text(min_size=0, max_size=12)
maybe = st.none() | text
refs = st.builds(SampleRef, sample_id=text, source=st.sampled_from(["ct", "photos"]),
                 kind=st.sampled_from(["dicom", "image"]), path=text, relpath=text, label=maybe, entity=maybe,
                 time=maybe, extra=st.sampled_from([(), (("site", "A"),), (("site", "ü"), ("scanner", "x"))]))
# digest fields are kept as raw bytes while every value is lower-case hex of one width: values
# of other widths, upper case, spaces or other text turn the field back into text where they come
hexes = st.binary(min_size=1, max_size=33).map(bytes.hex)
digests = (st.sampled_from(["", "ab" * 16, "AB" * 16, "ab " * 10 + "a", "0" * 64]) | text | hexes
           | st.binary(min_size=32, max_size=32).map(bytes.hex) | hexes.map(str.upper))
samples = st.builds(
    SpilledSample, key=text, ref=refs, spill=st.sampled_from(["a.spill", "b.spill"]),
    offset=st.integers(0, 2**40), pixel_bytes=st.integers(0, 2**31), meta_bytes=st.integers(0, 2**20),
    shape=st.sampled_from([(), (1, 8, 8), (3, 256, 256)]), dtype=st.sampled_from(["uint8", "uint16"]),
    sha256=digests, meta_sha256=digests, signature=st.sampled_from(["", "a.sig.npy"]), sig_row=st.integers(-1, 2**20),
    pixels_xxh3=st.integers(0, 2**64 - 1), stored_digest=st.sampled_from(["", "ab" * 16]) | digests)
# as builds make them: sha256 digests, a few repeated (exact copies), stored digests on some
sha = (st.sampled_from([bytes([b]) * 32 for b in range(4)]) | st.binary(min_size=32, max_size=32)
       | st.binary(min_size=16, max_size=16).map(lambda tail: b"\x01" * 16 + tail))   # first 16 bytes shared
built = st.builds(
    SpilledSample, key=text, ref=refs, spill=st.just("a.spill"), offset=st.integers(0, 2**40),
    pixel_bytes=st.integers(0, 2**31), meta_bytes=st.integers(0, 2**20), shape=st.just((1, 8, 8)),
    dtype=st.just("uint8"), sha256=sha.map(bytes.hex), meta_sha256=sha.map(bytes.hex),
    stored_digest=st.just("") | st.sampled_from([bytes([b]) * 16 for b in range(3)]).map(bytes.hex),
    blank=st.booleans())


@settings(max_examples=60, deadline=None)
@given(st.lists(samples, max_size=30))
def test_a_table_gives_back_the_records_it_was_built_from(records: list[SpilledSample]) -> None:
    table = SampleTable.of(records)
    assert len(table) == len(records)
    assert list(table) == records
    assert [table[i] for i in range(len(records))] == records
    assert [table[-1 - i] for i in range(len(records))] == records[::-1]
    assert pickle.loads(pickle.dumps(table)).column("path") == [r.ref.path for r in records]
    assert table.column("key") == [r.key for r in records]
    assert table.column("entity") == [r.ref.entity for r in records]
    assert table.array("sig_row").tolist() == [r.sig_row for r in records]
    assert table.column("signature") == [r.signature for r in records]
    assert table.nbytes.tolist() == [r.nbytes for r in records]
    for name in ("key", "path", "time", "label", "entity", "source", "offset", "sig_row", "signature", "sha256",
                 "meta_sha256", "stored_digest"):
        assert table.arrow(name).to_pylist() == table.column(name), name
    for name in ("sha256", "meta_sha256", "stored_digest"):
        data, ends = table.text_bytes(name)
        starts = [0, *ends.tolist()][:len(ends)]
        assert [data[a:b].decode() for a, b in zip(starts, ends.tolist(), strict=True)] == [
            v or "" for v in table.column(name)]


@settings(max_examples=60, deadline=None)
@given(st.lists(samples, min_size=1, max_size=30), st.data())
def test_take_slice_and_sort_select_the_same_records_as_on_a_list(records: list[SpilledSample],
                                                                 data: st.DataObject) -> None:
    table = SampleTable.of(records)
    rows = data.draw(st.lists(st.integers(0, len(records) - 1), max_size=40))
    assert list(table.take(rows)) == [records[i] for i in rows]
    start, stop, step = data.draw(st.tuples(st.integers(-40, 40), st.integers(-40, 40), st.integers(1, 3)))
    assert list(table[start:stop:step]) == records[start:stop:step]
    assert list(table.sorted_by_key()) == sorted(records, key=lambda r: r.key)
    assert table == SampleTable.of(records) and table.take(rows) == SampleTable.of([records[i] for i in rows])
    assert (table == table[1:]) == (records == records[1:]) and table != records


@settings(max_examples=60, deadline=None)
@given(st.lists(built, max_size=30), st.lists(built, max_size=5), st.data())
def test_digests_are_kept_as_raw_bytes_and_read_back_as_the_hex_they_were(
        records: list[SpilledSample], more: list[SpilledSample], data: st.DataObject) -> None:
    from packer.pipeline.dedup import exact_groups, exact_groups_of

    table = SampleTable.of(records)
    for name in ("sha256", "meta_sha256", "stored_digest"):
        assert table.digests(name) is not None, name   # 32 (16) bytes a row, not 64 (32) characters and an offset
        assert table.column(name) == [getattr(r, name) for r in records]
    assert list(table) == records
    assert list(pickle.loads(pickle.dumps(table))) == records
    rows = data.draw(st.lists(st.integers(0, max(len(records) - 1, 0)), max_size=20)) if records else []
    assert list(table.take(rows)) == [records[i] for i in rows] and list(table[1::2]) == records[1::2]
    # joined with tables of other digest widths, of text, or of no digest at all: the same records
    others = [SampleTable.of(more), SampleTable.of([dataclasses.replace(r, sha256="not hex") for r in more]),
              SampleTable.of([dataclasses.replace(r, stored_digest="") for r in more])]
    for other in others:
        joined = SampleTable.concat([table, other, table])
        assert list(joined) == records + list(other) + records
    # the exact-copy groups, read from the raw digests or from the same digests kept as text,
    # are those of the records' text
    want = exact_groups([r.sha256 for r in records], [r.stored_digest for r in records], [r.blank for r in records])
    assert exact_groups_of(table) == want
    for name in ("sha256", "stored_digest"):
        table.text[name] = table.field_text(name)
    assert table.digests("sha256") is None and exact_groups_of(table) == want


rooted = st.builds(lambda root, rel, **kw: SampleRef(path=root + rel, relpath=rel, **kw),
                   root=st.sampled_from(["/data/raw/", "/data/other/", "", "s3://bucket/x/"]), rel=text,
                   sample_id=text, source=st.just("ct"), kind=st.just("dicom"), label=maybe, entity=maybe, time=maybe)


@settings(max_examples=60, deadline=None)
@given(st.lists(rooted, max_size=30), st.lists(refs, max_size=4), st.data())
def test_a_path_is_kept_as_its_roots_code_and_read_back_whole(paths: list[SampleRef], others: list[SampleRef],
                                                              data: st.DataObject) -> None:
    from packer.pipeline.sampletable import _Prefixed

    for kind, records in ((RefTable, paths), (SampleTable, [_spilled(ref) for ref in paths])):
        table = kind.of(records)
        assert isinstance(table.text["path"], _Prefixed)   # a code a row, not the root's characters again
        assert list(table) == records and list(pickle.loads(pickle.dumps(table))) == records
        want = [(r.ref if isinstance(r, SpilledSample) else r).path for r in records]
        assert table.column("path") == want and table.arrow("path").to_pylist() == want
        assert [table.value("path", i) for i in range(len(records))] == want
        assert table.order_by(["path"]).tolist() == sorted(range(len(want)), key=lambda i: want[i])
        rows = data.draw(st.lists(st.integers(0, max(len(records) - 1, 0)), max_size=10)) if records else []
        assert list(table.take(rows)) == [records[i] for i in rows] and list(table[1::2]) == records[1::2]
        # a path that does not end with its relpath turns the field into text from there on
        more = others if kind is RefTable else [_spilled(ref) for ref in others]
        mixed = kind.of([*records, *more, *records])
        assert list(mixed) == [*records, *more, *records]
        assert list(kind.concat([table, kind.of(more), table])) == [*records, *more, *records]


def _spilled(ref: SampleRef) -> SpilledSample:
    return SpilledSample(key=ref.sample_id, ref=ref, spill="a.spill", offset=0, pixel_bytes=1, meta_bytes=1,
                         shape=(1,), dtype="uint8", sha256="")


def test_a_digest_field_becomes_text_where_a_value_is_not_a_digest_of_its_width() -> None:
    def record(sha: str) -> SpilledSample:
        ref = SampleRef(sample_id="a", source="ct", kind="dicom", path="a", relpath="a", label=None, entity=None,
                        time=None)
        return SpilledSample(key="a", ref=ref, spill="c.spill", offset=0, pixel_bytes=1, meta_bytes=1, shape=(1,),
                             dtype="uint8", sha256=sha)

    for odd in ("AB" * 32, "ab" * 31 + "a ", "ab" * 16, "zz" * 32, " " + "ab" * 32, "a"):
        values = ["", "01" * 32, odd, "02" * 32]
        table = SampleTable.of([record(v) for v in values])
        assert table.digests("sha256") is None and table.column("sha256") == values, odd
    table = SampleTable.of([record(v) for v in ("", "01" * 32, "", "02" * 32)])
    assert table.digests("sha256") is not None and table.column("sha256") == ["", "01" * 32, "", "02" * 32]
    assert table.text["sha256"].nbytes < 4 * 64


def test_few_distinct_values_are_kept_once() -> None:
    ref = SampleRef(sample_id="a", source="ct", kind="dicom", path="/x/a.dcm", relpath="a.dcm", label="normal",
                    entity="P1", time="2024-01-01T00:00:00")
    record = SpilledSample(key="a", ref=ref, spill="c.spill", offset=0, pixel_bytes=10, meta_bytes=2,
                           shape=(2, 4, 4), dtype="uint8", sha256="00" * 32, signature="c.sig.npy", sig_row=7)
    builder = TableBuilder(SampleTable)
    for i in range(1000):
        builder.append(record if i % 2 else SpilledSample(**{**vars_of(record), "key": f"k{i}", "offset": i}))
    table = builder.finish()
    codes, values = table.codes("label")
    assert values == ("normal",) and codes.dtype == np.int32 and set(codes.tolist()) == {0}
    assert table.codes("shape")[1] == ((2, 4, 4),)
    # per record: 98 bytes of text, 9 per text field (end offset, null flag), 4 per code, 8 per number
    assert len(pickle.dumps(table)) < 1000 * (98 + 9 * 9 + 9 * 4 + 7 * 8 + 5)
    # and no Python object per record or per distinct value: as many objects as for 3 records
    assert objects_reachable_from(table) == objects_reachable_from(table.take([0, 1, 2]))


def objects_reachable_from(root: object) -> int:
    seen: set[int] = set()
    todo = [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, type | types.ModuleType | types.FunctionType):
            continue
        seen.add(id(obj))
        todo.extend(gc.get_referents(obj))
    return len(seen)


def vars_of(record: SpilledSample) -> dict[str, object]:
    return {name: getattr(record, name) for name in record.__slots__}


def test_errors_name_what_is_wrong() -> None:
    table = SampleTable.of([])
    with pytest.raises(IndexError, match="record 0 of a table of 0"):
        table[0]
    with pytest.raises(IndexError, match="rows outside"):
        table.take([3])
    with pytest.raises(KeyError, match="no field 'colour'"):
        table.column("colour")
    with pytest.raises(TypeError, match="'shape' holds shape values, not text"):
        table.arrow("shape")
    assert as_table(table) is table


@settings(max_examples=40, deadline=None)
@given(st.lists(refs, max_size=30), st.data())
def test_a_ref_table_gives_back_discoverys_refs(records: list[SampleRef], data: st.DataObject) -> None:
    table = RefTable.of(records)
    assert list(table) == records and list(pickle.loads(pickle.dumps(table))) == records
    assert table.column("extra") == [r.extra for r in records]
    if records:
        start, stop = data.draw(st.tuples(st.integers(0, len(records)), st.integers(0, len(records))))
        assert list(table[start:stop]) == records[start:stop]
        assert table[len(records) - 1] == records[-1]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(samples, max_size=8), max_size=4))
def test_concatenated_tables_hold_every_record_in_order(parts: list[list[SpilledSample]]) -> None:
    joined = SampleTable.concat([SampleTable.of(part) for part in parts])
    flat = [record for part in parts for record in part]
    assert list(joined) == flat and joined.column("shape") == [r.shape for r in flat]
    assert list(pickle.loads(pickle.dumps(joined))) == flat


def test_a_few_rows_taken_from_many_distinct_values_read_back_as_they_were() -> None:
    # a shard's samples out of the build's table: their coded fields (entities, cells) are read
    # from the values those rows use, not by decoding every distinct value of the whole table
    records = [SpilledSample(key=f"k{i:04d}", ref=SampleRef(sample_id=f"s{i}", source="ct", kind="dicom",
                                                             path=f"p{i}", relpath=f"p{i}", label="a", entity=f"e{i}",
                                                             time=None, extra=(("site", f"S{i % 500}"),)),
                             spill="a.spill", offset=i, pixel_bytes=1, meta_bytes=1, shape=(1, 2, 2), dtype="uint8",
                             sha256="", signature="", sig_row=i)
               for i in range(2000)]
    rows = [1999, 3, 503, 3, 0]
    taken = SampleTable.of(records).take(rows)
    assert list(taken) == [records[i] for i in rows]
    assert taken.column("entity") == [f"e{i}" for i in rows]
    assert taken.column("extra") == [(("site", f"S{i % 500}"),) for i in rows]
    assert taken.take([]).column("entity") == []


@settings(max_examples=60, deadline=None)
@given(samples)
def test_a_cache_entry_records_a_sample_as_dataclasses_asdict_does(record: SpilledSample) -> None:
    """The records file's form of a sample (written for every chunk a build touches) is asdict's."""
    assert _sample_json(record) == dataclasses.asdict(record)
    assert canonical_json(_sample_json(record)) == canonical_json(dataclasses.asdict(record))


# keys as packer makes them are unique; any text, accents, CJK and astral characters included
unique_records = st.lists(samples, min_size=0, max_size=40, unique_by=lambda r: r.key)


@settings(max_examples=80, deadline=None)
@given(unique_records, st.lists(st.text(min_size=1, max_size=6), max_size=40, unique=True))
def test_the_sort_by_key_is_sorted_on_str_whatever_the_keys_characters(records: list[SpilledSample],
                                                                       keys: list[str]) -> None:
    # the order comes from Arrow (UTF-8 bytes, no Python object per record): it must be
    # Python's order of the keys as str, code point by code point
    records = [dataclasses.replace(r, key=k) for r, k in zip(records, keys + [r.key + "\U0001f600" for r in records],
                                                             strict=False)]
    records = list({r.key: r for r in records}.values())
    expected = sorted(records, key=lambda r: r.key)
    table = SampleTable.of(records)
    assert list(table.sorted_by_key()) == expected and list(table) == records
    released = table.sorted_by_key(release=True)
    assert list(released) == expected and list(pickle.loads(pickle.dumps(released))) == expected
    # the table given up is left empty (its fields went into the sorted one), and still a table
    assert len(table) == 0 and list(table) == [] and table.column("key") == []


def test_keys_that_differ_past_ascii_sort_as_python_sorts_them() -> None:
    keys = ["z", "é", "e\u0301", "\uffff", "\U0001f600", "Z", "a\x00b", "a", "ab", "中", "\x7f", "\x80"]
    records = [SpilledSample(key=k, ref=SampleRef(sample_id=k, source="ct", kind="dicom", path=k, relpath=k,
                                                  label=None, entity=None, time=None),
                             spill="a.spill", offset=0, pixel_bytes=1, meta_bytes=1, shape=(1,), dtype="uint8",
                             sha256="") for k in keys]
    assert SampleTable.of(records).sorted_by_key(release=True).column("key") == sorted(keys)


@settings(max_examples=40, deadline=None)
@given(st.lists(samples, max_size=30))
def test_a_builder_that_hands_its_buffers_over_gives_the_same_table_and_starts_again_empty(
        records: list[SpilledSample]) -> None:
    kept, released = TableBuilder(SampleTable), TableBuilder(SampleTable)
    kept.extend(records)
    released.extend(records)
    assert list(released.finish(release=True)) == records == list(kept.finish())
    assert list(released.finish()) == []
    released.extend(records[:2])
    assert list(released.finish(release=True)) == records[:2]


def _held_bytes(table: SampleTable) -> int:
    return (sum(c.nbytes for c in table.text.values())
            + sum(c.codes.nbytes for c in table.coded.values()) + sum(a.nbytes for a in table.numbers.values()))


def test_finishing_and_sorting_a_table_given_up_holds_it_once_plus_a_field_not_twice() -> None:
    # the client's records at 10M samples are GBs: the builder's hand-over and the sort by key
    # copy them field by field, freeing each field given up, so the peak is one table and one
    # field and its offsets (sha256, the largest, is an eighth of the table here; two tables would be 1.0)
    importlib.import_module("pyarrow.compute")  # imported first: its modules are not the records' memory
    tracemalloc.start()
    try:
        builder = TableBuilder(SampleTable)
        for i in range(20_000):
            sample_id = f"{(i * 2654435761) % (1 << 48):012x}"
            rel = f"E{i // 200:05d}/IM{i % 200:04d}.dcm"
            ref = SampleRef(sample_id=sample_id, source="ct", kind="dicom", path=f"/raw/{rel}", relpath=rel,
                            label="a", entity=f"E{i // 200:05d}", time=None)
            builder.append(SpilledSample(key=f"{sample_id}-s0000", ref=ref, spill="c.spill", offset=i, pixel_bytes=1,
                                         meta_bytes=1, shape=(1, 2, 2), dtype="uint8", sha256=f"{i:064x}",
                                         meta_sha256=f"{i:064x}"))
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        table = builder.finish(release=True)
        held = _held_bytes(table)
        assert tracemalloc.get_traced_memory()[1] - before < 0.4 * held
        keys = table.column("key")
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        ordered = table.sorted_by_key(release=True)
        assert tracemalloc.get_traced_memory()[1] - before < 0.4 * held
    finally:
        tracemalloc.stop()
    assert ordered.column("key") == sorted(keys) and len(table) == 0
