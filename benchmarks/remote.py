"""Training from object storage: the shard cache and read-ahead under store latency and a bandwidth cap.

Usage (from the repository root; needs the dev extra's moto[server] and s3fs):

    .venv/bin/python benchmarks/remote.py                       # 6,000 samples 3×128×128, 50 ms, 50 MB/s
    .venv/bin/python benchmarks/remote.py --latency 0.1 --bandwidth 20e6 --no-write

Data: a WebDataset dataset of ``--samples`` uint8 samples (``--shape``) in ``--shard-mb`` MiB
shards, written with packer's own shard writer and manifest (``tests/loader_fixtures.py``),
uploaded straight to moto's S3 server. The loader reaches the server through a proxy (in the
server's process, not the loader's) that waits ``--latency`` seconds before answering each
request and sends every response body at no more than ``--bandwidth`` bytes/s per connection:
a store far away, as a training node sees S3. The proxy counts and times every request it
answers, by method and by object (shard or not), from whichever process sent it: the loader's
main process reads the manifest, the DataLoader workers read (or download) the shards.

The server process (moto and the proxy) is spawned, reports both endpoints when it is ready
(or its traceback when it is not; 120 s at most), and stops when the benchmark ends, fails or
is killed (it watches its parent), so no run leaves a server behind.

Every case reads the train split with ``make_loader(ShardDataset(...), batch_size=64,
num_workers=2)``, two epochs (four for local disk and the warm cache), and reports per epoch:
samples/s over the whole epoch,
samples/s *after warm-up* (from the end of the first 10% of batches to the end of the epoch),
GETs of shard objects and all requests, shard GETs in flight on average, and the cache
folder's largest size seen (sampled every 50 ms):

- ``local disk``: the same shards on local disk (the rate to match);
- ``stream (no cache)``: the s3:// manifest with no cache (every epoch reads every shard from the store);
- ``cache, no read-ahead``: ``cache_dir`` with ``read_ahead=0``;
- ``cache + read-ahead 2``: ``cache_dir`` with the default ``read_ahead=2``;
- ``cache limit 40% + read-ahead 2``: as above with ``cache_limit`` at 40% of the dataset's bytes.

A loader that gives no batch for ``STALL_S`` seconds is stopped and its case run again from an
empty cache (see ``run_case``: two workers can deadlock in the cache's locks); stalls are reported.

Prints a table and one JSON line; ``--write`` (default) replaces the section in RESULTS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import multiprocessing
import os
import platform
import queue
import shutil
import statistics
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parents[1]
SECTION = "## Training from object storage: shard cache and read-ahead"
BATCH, WORKERS = 64, 2
#: No batch for this long: the loader is stuck (see ``run_case``); a batch needs a shard or two, < 1 s here.
STALL_S = 20.0
ATTEMPTS = 3


# -- the slow store ----------------------------------------------------------------------
#: Request headers that belong to one hop (the client's connection to the proxy), not to the
#: request: the proxy de-chunks a chunked body and sends it upstream with a Content-Length.
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade",
              "expect", "content-length"}
SHARD_SUFFIXES = (".tar", ".parquet")


def request_kind(method: str, target: str) -> str:
    """``GET shard``, ``HEAD shard``, ``GET other`` (manifest, index), ``GET list``, ``PUT other``..."""
    parsed = urlsplit(target)
    if parsed.path.endswith(SHARD_SUFFIXES):
        return f"{method} shard"
    if method == "GET" and parsed.path.strip("/").count("/") == 0:  # the bucket itself: a listing
        return "GET list"
    return f"{method} other"


def serve(latency: float, bandwidth: float, parent: int, ready: Any, stop: Any) -> None:
    """moto's S3 server, and a proxy in front of it that adds latency and caps bandwidth.

    Puts ``{"moto": url, "proxy": url}`` on ``ready`` (or ``{"error": traceback}``), then serves
    until ``stop`` is set or the parent process is gone (so a killed benchmark leaves no server).
    """
    try:
        import logging

        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's server logs every request otherwise

        moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        # start() waits on an event its server thread sets only once the socket is bound: when
        # that thread fails, start() waits forever. Wait for it with a deadline instead.
        starter = threading.Thread(target=moto.start, daemon=True)
        starter.start()
        starter.join(60)
        if starter.is_alive():
            raise TimeoutError("moto's server did not start within 60 s")
        upstream = moto.get_host_and_port()
        stats: dict[str, Any] = {"requests": {}, "log": []}
        lock = threading.Lock()

        class Proxy(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _body(self) -> bytes:
                if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                    parts: list[bytes] = []
                    while True:
                        size = int(self.rfile.readline(1 << 16).split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            while self.rfile.readline(1 << 16) not in (b"\r\n", b"\n", b""):
                                pass  # trailers: none that moto needs (aws-chunked trailers are in the body)
                            return b"".join(parts)
                        parts.append(self.rfile.read(size))
                        self.rfile.readline(1 << 16)
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            def _stats(self) -> None:
                with lock:
                    body = json.dumps(stats).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _forward(self) -> None:
                if self.path == "/__stats":
                    self._stats()
                    return
                began = time.monotonic()
                kind = request_kind(self.command, self.path)
                payload = self._body()
                # Host stays as the client sent (and signed) it; http.client then adds none of its own
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                conn = http.client.HTTPConnection(*upstream, timeout=120)
                try:
                    conn.request(self.command, self.path,
                                 body=payload if payload or self.command in ("PUT", "POST") else None,
                                 headers=headers)
                    response = conn.getresponse()
                    data = response.read()
                    upstream_length = response.getheader("Content-Length")
                    reply_headers = response.getheaders()
                finally:
                    conn.close()
                time.sleep(latency)  # the store's round trip
                self.send_response(response.status, response.reason)
                for key, value in reply_headers:
                    if key.lower() not in HOP_BY_HOP | {"server", "date"}:
                        self.send_header(key, value)
                # a HEAD's Content-Length is the object's size (what s3fs's info() reads), not 0
                no_body = self.command == "HEAD" or response.status in (204, 304) or response.status < 200
                self.send_header("Content-Length", str(upstream_length if self.command == "HEAD" and upstream_length
                                                       else len(data)))
                self.end_headers()
                sent = 0
                if not no_body:
                    start, step = time.monotonic(), 256 << 10
                    for offset in range(0, len(data), step):
                        self.wfile.write(data[offset:offset + step])
                        sent += len(data[offset:offset + step])
                        due = start + (offset + step) / bandwidth
                        if due > time.monotonic():
                            time.sleep(due - time.monotonic())
                    self.wfile.flush()
                with lock:
                    stats["requests"][kind] = stats["requests"].get(kind, 0) + 1
                    stats["log"].append([kind, round(began, 4), round(time.monotonic(), 4), sent,
                                         self.client_address[1], urlsplit(self.path).path])

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                if not isinstance(sys.exc_info()[1], ConnectionError):  # a worker that exits drops its connections
                    super().handle_error(request, client_address)

        server = Server(("127.0.0.1", 0), Proxy)
        threading.Thread(target=server.serve_forever, daemon=True).start()
    except Exception:  # reported to the benchmark, which raises it there
        ready.put({"error": traceback.format_exc()})
        return
    ready.put({"moto": f"http://{upstream[0]}:{upstream[1]}", "proxy": f"http://127.0.0.1:{server.server_address[1]}"})
    try:
        while not stop.wait(0.5):
            if os.getppid() != parent:  # the benchmark died without stopping us
                break
    finally:
        server.shutdown()
        server.server_close()
        moto.stop()


@contextlib.contextmanager
def slow_store(latency: float, bandwidth: float) -> Iterator[dict[str, str]]:
    """The server process, started and always stopped: ``{"moto": url, "proxy": url}``."""
    ctx = multiprocessing.get_context("spawn")
    ready, stop = ctx.Queue(), ctx.Event()
    process = ctx.Process(target=serve, args=(latency, bandwidth, os.getpid(), ready, stop), daemon=True,
                          name="packer-remote-store")
    process.start()
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                info = ready.get(timeout=1)
                break
            except queue.Empty:
                if not process.is_alive():
                    raise RuntimeError(f"the store process exited ({process.exitcode}) before it was ready") from None
                if time.monotonic() > deadline:
                    raise TimeoutError("the store process was not ready within 120 s") from None
        if "error" in info:
            raise RuntimeError(f"the store process failed to start:\n{info['error']}")
        yield info
    finally:
        stop.set()
        process.join(timeout=15)
        if process.is_alive():
            process.terminate()
            process.join(timeout=5)
        if process.is_alive():
            process.kill()
            process.join(timeout=5)
        ready.close()
        ready.join_thread()


def store_stats(endpoint: str) -> dict[str, Any]:
    host, port = endpoint.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("GET", "/__stats")
        return json.loads(conn.getresponse().read())
    finally:
        conn.close()


def request_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, int]:
    keys = set(before["requests"]) | set(after["requests"])
    return {k: after["requests"].get(k, 0) - before["requests"].get(k, 0) for k in sorted(keys)
            if after["requests"].get(k, 0) - before["requests"].get(k, 0)}


# -- the cases ---------------------------------------------------------------------------
def folder_bytes(folder: Path) -> tuple[int, int]:
    """(bytes of cache entries, bytes of every file: entries plus ``.partial`` downloads)."""
    entries = every = 0
    for path in folder.iterdir() if folder.exists() else ():
        try:
            size = path.stat().st_size
        except OSError:
            continue
        every += size
        if not path.name.startswith("."):
            entries += size
    return entries, every


def in_flight(log: list[list[Any]], start: float, end: float) -> float:
    """Shard GETs in flight on average over [start, end] (seconds of shard GETs / seconds)."""
    busy = sum(max(0.0, min(t1, end) - max(t0, start)) for kind, t0, t1, *_ in log if kind == "GET shard")
    return busy / (end - start) if end > start else float("nan")


def run_epochs(manifest: str, *, endpoint: str | None, cache: Path | None, limit: int | None,
               read_ahead: int, epochs: int = 2) -> dict[str, Any]:
    from packer.loader import ShardDataset, make_loader

    options = {"endpoint_url": endpoint} if endpoint else None
    before = store_stats(endpoint) if endpoint else None
    dataset = ShardDataset(manifest, "train", storage_options=options, cache_dir=cache, cache_limit=limit,
                           read_ahead=read_ahead, seed=0)
    setup = request_delta(before, store_stats(endpoint)) if endpoint and before else {}
    loader = make_loader(dataset, batch_size=BATCH, num_workers=WORKERS, timeout=STALL_S)
    peak = {"entries": 0, "all": 0}
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.05):
            if cache is not None:
                entries, every = folder_bytes(cache)
                peak["entries"], peak["all"] = max(peak["entries"], entries), max(peak["all"], every)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    out = []
    try:
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            before = store_stats(endpoint) if endpoint else None
            peak.update(entries=0, all=0)
            stamps, samples = [], []
            began, start = time.monotonic(), time.perf_counter()
            for batch in loader:
                stamps.append(time.perf_counter())
                samples.append(len(batch["key"]))
            total, ended = time.perf_counter() - start, time.monotonic()
            warm = max(1, len(stamps) // 10)
            after = (sum(samples[warm:]) / (stamps[-1] - stamps[warm - 1])) if len(stamps) > warm else float("nan")
            row: dict[str, Any] = {"epoch": epoch + 1, "samples": sum(samples), "seconds": round(total, 2),
                                   "rate": round(sum(samples) / total, 1), "rate_after_warmup": round(after, 1)}
            if endpoint and before:
                now = store_stats(endpoint)
                row["requests"] = request_delta(before, now)
                row["shard_gets"] = row["requests"].get("GET shard", 0)
                row["all_requests"] = sum(row["requests"].values())
                row["shard_gets_in_flight"] = round(in_flight(now["log"], began, ended), 2)
            if cache is not None:
                row["cache_peak_mb"] = round(peak["entries"] / 1e6, 1)
                row["cache_peak_with_partial_mb"] = round(peak["all"] / 1e6, 1)
                row["cache_end_mb"] = round(folder_bytes(cache)[0] / 1e6, 1)
            out.append(row)
    finally:
        done.set()
        loader.close()
    return {"setup_requests": setup, "epochs": out}


def run_case(manifest: str, *, cache: Path | None, **kwargs: Any) -> dict[str, Any]:
    """:func:`run_epochs`, again from a fresh cache folder when the loader stalls.

    With ``num_workers=2`` both workers read every shard (batches alternate between them), so
    both ask the cache for the same shard at once. Before ``ShardCache.fetch`` polled its lock,
    a worker could wait on it while the other held the shard open (shared), idle until the main
    process took the batch the waiting worker owed it: a deadlock, which the first run of this
    benchmark hit. The DataLoader ``timeout`` would turn a stall into an error; it is counted and
    reported, so a regression shows.
    """
    stalls: list[str] = []
    for attempt in range(ATTEMPTS):
        folder = None if cache is None else cache.with_name(f"{cache.name}-{attempt}")
        try:
            result = run_epochs(manifest, cache=folder, **kwargs)
        except RuntimeError as err:
            if "timed out" not in str(err) or attempt == ATTEMPTS - 1:
                raise
            stalls.append(str(err))
            print(f"stalled ({err}); again from an empty cache", file=sys.stderr, flush=True)
            continue
        result["stalls"] = stalls
        return result
    raise AssertionError("unreachable")


def make_data(root: Path, samples: int, shape: tuple[int, ...], shard_mb: float) -> Path:
    sys.path.insert(0, str(REPO))
    from tests.loader_fixtures import build_dataset

    per_shard = max(1, int(shard_mb * (1 << 20) // (int(__import__("numpy").prod(shape)) + 1536)))
    sizes = [per_shard] * (samples // per_shard) + ([samples % per_shard] if samples % per_shard else [])
    return build_dataset(root, shard_sizes=sizes, shape=shape)


def run(args: argparse.Namespace) -> dict[str, Any]:
    import boto3

    # credentials for moto (any will do); set before the DataLoader workers fork, so they have them too
    os.environ.update({"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"})
    machine = describe()
    scratch = Path(tempfile.mkdtemp(prefix="packer-remote-"))
    try:
        with slow_store(args.latency, args.bandwidth) as store:
            manifest = make_data(scratch / "local", args.samples, tuple(args.shape), args.shard_mb)
            local = manifest.parent
            # the upload goes to moto directly: the proxy's latency and cap are for the loader
            s3 = boto3.client("s3", endpoint_url=store["moto"])
            s3.create_bucket(Bucket="bench")
            for path in sorted(local.iterdir()):
                s3.put_object(Bucket="bench", Key=f"ds/{path.name}", Body=path.read_bytes())
            url, endpoint = "s3://bench/ds/manifest.json", store["proxy"]
            data_bytes = sum(p.stat().st_size for p in local.glob("*.tar"))
            shards = len(list(local.glob("*.tar")))
            cases: dict[str, dict[str, Any]] = {}
            # local disk and the warm cache: 4 epochs, so the comparison of the warm ones (2-4) is a
            # median of 3 (an epoch here is under a second, and this machine's noise is not)
            cases["local disk"] = run_case(str(manifest), endpoint=None, cache=None, limit=None, read_ahead=0,
                                           epochs=4)
            cases["stream (no cache)"] = run_case(url, endpoint=endpoint, cache=None, limit=None, read_ahead=0)
            for name, ahead, limit, epochs in (("cache, no read-ahead", 0, None, 2),
                                               ("cache + read-ahead 2", 2, None, 4),
                                               ("cache limit 40% + read-ahead 2", 2, int(0.4 * data_bytes), 2)):
                cases[name] = run_case(url, endpoint=endpoint, cache=scratch / f"cache-{len(cases)}", limit=limit,
                                       read_ahead=ahead, epochs=epochs)
                cases[name]["limit_mb"] = round(limit / 1e6, 1) if limit else None
        return {"samples": args.samples, "shape": list(args.shape), "shards": shards,
                "shard_mb": round(data_bytes / shards / 1e6, 2), "dataset_mb": round(data_bytes / 1e6, 1),
                "latency_s": args.latency, "bandwidth_mb_s": round(args.bandwidth / 1e6, 1), "batch": BATCH,
                "workers": WORKERS, "cases": cases,
                "machine": {**machine, "load_1min_at_end": round(os.getloadavg()[0], 2)}}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def describe() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {"cpus": os.cpu_count(), "cpu": cpu, "python": platform.python_version(),
            "load_1min_at_start": round(os.getloadavg()[0], 2)}


def render(rec: dict[str, Any]) -> str:
    cases = rec["cases"]
    local_rate = statistics.median([e["rate_after_warmup"] for e in cases["local disk"]["epochs"]])
    m = rec["machine"]
    setup = {name: case["setup_requests"] for name, case in cases.items() if case["setup_requests"]}
    setups = sorted({", ".join(f"{n} {k}" for k, n in s.items()) for s in setup.values()})
    lines = [SECTION, "",
             f"{rec['samples']:,} samples {'×'.join(map(str, rec['shape']))} uint8 in {rec['shards']} WebDataset "
             f"shards of {rec['shard_mb']} MB ({rec['dataset_mb']} MB), in moto's S3 server behind a proxy that adds "
             f"{rec['latency_s'] * 1000:.0f} ms to every request and sends each response at no more than "
             f"{rec['bandwidth_mb_s']} MB/s; `make_loader(ShardDataset(...), batch_size={rec['batch']}, "
             f"num_workers={rec['workers']})`, two epochs per case (four for local disk and the warm cache); "
             "one run of `benchmarks/remote.py` "
             f"({m['cpus']} CPUs, {m['cpu']}, Python {m['python']}; 1-minute load {m['load_1min_at_start']} at the "
             f"start, {m['load_1min_at_end']} at the end).",
             "",
             "*after warm-up*: from the end of the first 10% of batches to the end of the epoch; *% local*: that "
             "rate against local disk's median. *shard GETs*: GET requests for shard objects the proxy answered "
             "during the epoch, from every process (the DataLoader workers read the shards); *all requests*: every "
             "request in the epoch (shard GETs, HEADs, listings, other objects). Constructing the dataset (manifest, "
             f"main process) is counted apart: {'; '.join(setups) or 'none'} per remote case. *in flight*: seconds "
             "of shard GETs / seconds of the epoch (1.0: one download at all times). *cache peak*: the largest "
             "size of the cache's entries seen (sampled every 50 ms; with `.partial` downloads in brackets).",
             "",
             "| case | epoch | s | samples/s | after warm-up | % local | shard GETs | all requests | in flight "
             "| cache peak MB |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, case in cases.items():
        for e in case["epochs"]:
            share = 100 * e["rate_after_warmup"] / local_rate if local_rate else float("nan")
            peak = (f"{e['cache_peak_mb']} ({e['cache_peak_with_partial_mb']})" if "cache_peak_mb" in e else "-")
            if case.get("limit_mb"):
                peak += f" of {case['limit_mb']}"
            lines.append(f"| {name} | {e['epoch']} | {e['seconds']} | {e['rate']:,.0f} | {e['rate_after_warmup']:,.0f} "
                         f"| {share:.0f}% | {e.get('shard_gets', '-')} | {e.get('all_requests', '-')} "
                         f"| {e.get('shard_gets_in_flight', '-')} | {peak} |")
    stalled = {name: len(case["stalls"]) for name, case in cases.items() if case["stalls"]}
    lines += ["", *checks(rec, local_rate),
              "- loader stalls (no batch for " f"{STALL_S:.0f} s; the case was run again from an empty cache): "
              + (", ".join(f"{name} {n}" for name, n in stalled.items()) if stalled else "none") + "."]
    return "\n".join(lines) + "\n"


def checks(rec: dict[str, Any], local_rate: float) -> list[str]:
    """The questions this benchmark answers, from the numbers above."""
    c = rec["cases"]
    plain, ahead, small = (c["cache, no read-ahead"]["epochs"], c["cache + read-ahead 2"]["epochs"],
                           c["cache limit 40% + read-ahead 2"])
    local = c["local disk"]["epochs"]
    warm = statistics.median(e["rate_after_warmup"] for e in ahead[1:])
    local_warm = statistics.median(e["rate_after_warmup"] for e in local[1:])
    out = [f"- epoch 1, read-ahead 2 against none: {ahead[0]['rate']:,.0f} against {plain[0]['rate']:,.0f} "
           f"samples/s ({ahead[0]['rate'] / plain[0]['rate']:.2f}×); shard GETs in flight "
           f"{ahead[0]['shard_gets_in_flight']} against {plain[0]['shard_gets_in_flight']}.",
           f"- epoch 2 with a warm cache that holds the dataset: {plain[1]['shard_gets']} and "
           f"{ahead[1]['shard_gets']} shard GETs ({plain[1]['all_requests']} and {ahead[1]['all_requests']} "
           f"requests in all), {plain[1]['rate']:,.0f} and {ahead[1]['rate']:,.0f} samples/s.",
           f"- cache limit {small['limit_mb']} MB ({rec['dataset_mb']} MB dataset): entries peaked at "
           + " and ".join(f"{e['cache_peak_mb']} MB ({e['cache_peak_with_partial_mb']} with partial downloads)"
                          for e in small["epochs"])
           + f" in epochs 1 and 2, {small['epochs'][-1]['cache_end_mb']} MB at the end; epoch 2 fetched "
           f"{small['epochs'][1]['shard_gets']} of {rec['shards']} shards again.",
           "- cached + read-ahead after warm-up against local disk: "
           + ", ".join(f"epoch {e['epoch']} {100 * e['rate_after_warmup'] / local_rate:.0f}%" for e in ahead)
           + f"; warm epochs (2-{len(ahead)}) against local disk's epochs 2-{len(local)}, medians: "
           + f"{warm:,.0f} against {local_warm:,.0f} samples/s, {100 * warm / local_warm:.0f}% (target ≥ 80%)."]
    return out


def write_section(text: str) -> None:
    path = REPO / "benchmarks" / "RESULTS.md"
    current = path.read_text()
    if SECTION in current:
        start = current.index(SECTION)
        end = current.find("\n## ", start + len(SECTION))
        current = current[:start] + text + ("\n" + current[end + 1:] if end != -1 else "")
    else:
        current = current.rstrip("\n") + "\n\n" + text
    path.write_text(current)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=6000)
    parser.add_argument("--shape", type=int, nargs=3, default=[3, 128, 128])
    parser.add_argument("--shard-mb", type=float, default=8.0)
    parser.add_argument("--latency", type=float, default=0.05, help="seconds added to every request")
    parser.add_argument("--bandwidth", type=float, default=50e6, help="bytes/s per connection")
    parser.add_argument("--no-write", dest="write", action="store_false")
    args = parser.parse_args()
    rec = run(args)
    text = render(rec)
    print(text)
    print(json.dumps(rec))
    if args.write:
        write_section(text)


if __name__ == "__main__":
    main()
