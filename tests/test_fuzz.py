"""The fuzz harnesses in the suite: corpus replay, a bounded coverage-guided run each, memory.

* Every file in ``fuzz/corpus/<target>/`` (seeds, and ``regression-*`` inputs that once found a
  bug) goes through its harness function directly, in this process.
* Each harness runs under atheris/libFuzzer for a few seconds in a subprocess
  (``SMITH_FAST_FUZZ_SECONDS``, default 4), starting from the committed corpus, with an RSS limit
  and a fixed seed (``SMITH_FAST_FUZZ_SEED``, default 1; hash seed 0): the same inputs on every
  machine, so CI does not fail at random on a bug it did not bring in. Exploring is the job of the
  long, randomly seeded run, ``make fuzz``. A failure shows the reproducer libFuzzer wrote.
* Replaying the corpus over and over must not grow Python's traced memory or the process's RSS.

The harnesses drive both twins of each wire-core module in lockstep (``fuzz/_common.py``, ``twins``),
so these tests do not take the ``[c]``/``[py]`` fixtures: every input already runs both.
"""

from __future__ import annotations

import gc
import importlib
import os
import pathlib
import re
import subprocess
import sys
import tracemalloc
from types import ModuleType

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fuzz" / "corpus"
TARGETS = ["framing", "chunking", "jsonl", "envelope", "events", "plan", "v0fields"]
FUZZ_SECONDS = int(os.environ.get("SMITH_FAST_FUZZ_SECONDS", "4"))
FUZZ_SEED = int(os.environ.get("SMITH_FAST_FUZZ_SEED", "1"))
RSS_LIMIT_MB = 512


def harness(target: str) -> ModuleType:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module(f"fuzz.fuzz_{target}")


def corpus_files() -> list[pathlib.Path]:
    return sorted(p for target in TARGETS for p in (CORPUS / target).iterdir() if p.is_file())


def test_every_target_has_a_corpus() -> None:
    for target in TARGETS:
        files = list((CORPUS / target).glob("seed-*"))
        assert len(files) >= 4, f"fuzz/corpus/{target} has {len(files)} seeds"
        assert sum(p.stat().st_size for p in (CORPUS / target).iterdir()) < 64 * 1024, "keep the corpus small"


@pytest.mark.parametrize("path", corpus_files(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_corpus_replay(path: pathlib.Path) -> None:
    harness(path.parent.name).test_one_input(path.read_bytes())


def test_regressions_are_kept() -> None:
    """The bugs the fuzzers found stay in the corpus (fuzz/README.md lists them)."""
    names = {f"{p.parent.name}/{p.name}" for p in CORPUS.glob("*/regression-*")}
    assert names >= {
        "framing/regression-buffered-after-split-prefix-error",
        "framing/regression-not-bytes-feed-errors",
        "jsonl/regression-line-decoder-feed-int",
        "jsonl/regression-brackets-only-inside-strings",
        "jsonl/regression-lone-surrogate-in-dropped-duplicate",
        "plan/regression-nested-expansions-recursion",
        "v0fields/regression-nul-in-cwd",
    }


def test_framing_regression_buffered_after_split_prefix_error(framing: ModuleType) -> None:
    """Found by fuzz_framing: after an error on a length prefix split across feeds, the twins
    disagreed on ``buffered`` (3 vs 2): the Python twin had topped its prefix buffer up before
    parsing it. A failed decoder now holds nothing, in both twins."""
    from smith_fast.errors import FrameTooLarge

    dec = framing.FrameDecoder(5)
    assert dec.feed(b"\xbb\xdb") == [] and dec.buffered == 2
    with pytest.raises(FrameTooLarge) as info:
        dec.feed(b"\x03")
    assert info.value.offset == 0 and info.value.size == 0x3B | 0x5B << 7 | 3 << 14
    assert dec.buffered == 0 and dec.offset == 0


@pytest.mark.parametrize(
    "bogus", ["\x01a", 7, None, memoryview(b"\x01.a.")[::2], [1, 97]], ids=["str", "int", "None", "strided", "list"]
)
def test_framing_regression_not_bytes(framing: ModuleType, bogus: object) -> None:
    """Found extending fuzz_framing to non-bytes input (it checks this now): the twins refused it
    with different errors (``BufferError`` vs ``TypeError`` for a strided view, different messages
    otherwise). Both now raise the same ``TypeError``, and the stream is left as it was."""
    dec = framing.FrameDecoder()
    assert dec.feed(b"\x02a") == []
    with pytest.raises(TypeError) as info:
        dec.feed(bogus)
    assert str(info.value) == f"feed() needs a contiguous bytes-like object, not {type(bogus).__name__!r}"
    assert (dec.offset, dec.buffered) == (0, 2)
    assert dec.feed(b"b") == [b"ab"]


def test_jsonl_regression_line_decoder_rejects_non_bytes() -> None:
    """Found extending fuzz_jsonl to non-bytes input: ``LineDecoder.feed(7)`` read the int as seven
    NUL bytes (``bytes(7)``)."""
    from smith_fast.jsonl import LineDecoder

    dec = LineDecoder()
    assert dec.feed(b"ab") == []
    for bogus in (7, "text", None):
        with pytest.raises(TypeError, match="bytes-like"):
            dec.feed(bogus)  # type: ignore[arg-type]
    assert dec.buffered == 2
    assert dec.feed(memoryview(b"cXdX\nX")[::2]) == [b"abcd"]  # any bytes-like object, strided too


@pytest.mark.parametrize("backend", ["json", "orjson"])
def test_jsonl_regression_brackets_only_inside_strings(backend: str) -> None:
    """Found by fuzz_jsonl (a 4-minute run): a line with more than 127 brackets, all of them inside
    strings, made the nesting check take ``max()`` of nothing; the ``ValueError`` escaped
    ``decode_command`` and the service dropped the v0 connection without a word."""
    from smith_fast.errors import ProtocolError
    from smith_fast.jsonl import JsonlCodec

    codec = JsonlCodec(backend)
    line = b'"' + b"[" * 128 + b'"'
    with pytest.raises(ProtocolError, match="must be a JSON object, got the string"):
        codec.decode_command(line)
    with pytest.raises(ProtocolError, match="must be a JSON object"):
        codec.decode_event(line)
    # the same check guards tool results on their way to a v0 peer
    assert codec.tool_result("r", True, line, None) == (
        b'{"type":"ToolResult","data":{"request_id":"r","success":true,"result":' + line + b',"error":null}}\n'
    )


@pytest.mark.parametrize("backend", ["json", "orjson"])
def test_jsonl_regression_lone_surrogate_in_dropped_duplicate(backend: str) -> None:
    """Found by fuzz_jsonl (CI's bounded run): a lone surrogate escape in the value of a key that a
    later duplicate overrides. orjson refuses the line while parsing; the stdlib backend checked the
    parsed value, where the duplicate had already dropped the lone surrogate, and went on to a
    different error. Both backends must call such a line invalid JSON."""
    from smith_fast.errors import ProtocolError
    from smith_fast.jsonl import JsonlCodec

    codec = JsonlCodec(backend)
    line = (CORPUS / "jsonl" / "regression-lone-surrogate-in-dropped-duplicate").read_bytes()
    for decode in (codec.decode_command, codec.decode_event):
        with pytest.raises(ProtocolError) as info:
            decode(line)
        assert info.value.details == {"reason": "invalid_json"}
    dup = rb'{"type":"Log","data":{"level":"Info","message":"\\ud800","message":"\udbff\udfff","timestamp":1}}'
    assert codec.decode_event(dup).log.message == "\U0010ffff"  # the first one escapes a backslash
    with pytest.raises(ProtocolError, match="invalid JSON"):
        codec.decode_event(dup.replace(rb"\\ud800", rb"\udc00"))


def _last(pattern: str, text: str) -> str | None:
    found = re.findall(pattern, text)
    return found[-1] if found else None


@pytest.mark.timeout(FUZZ_SECONDS * 10 + 60)
@pytest.mark.parametrize("target", TARGETS)
def test_bounded_fuzz_run(target: str, tmp_path: pathlib.Path) -> None:
    """libFuzzer for a few seconds from the committed corpus: no crash, no broken invariant, bounded RSS."""
    work = tmp_path / "corpus"
    work.mkdir()
    argv = [
        sys.executable, "-m", f"fuzz.fuzz_{target}",
        f"-max_total_time={FUZZ_SECONDS}", f"-seed={FUZZ_SEED}", f"-rss_limit_mb={RSS_LIMIT_MB}", "-timeout=20",
        "-print_final_stats=1", f"-artifact_prefix={tmp_path}/", str(work), str(CORPUS / target),
    ]  # fmt: skip
    # libFuzzer's RSS figure is getrusage's ru_maxrss, which Linux carries across fork+exec: started
    # straight from a big pytest process, the harness would "start" at pytest's own size. A shell in
    # between (which forks rather than execs the harness: the command is not its last) starts it clean.
    launcher = ["/bin/sh", "-c", '"$@"; status=$?; exit $status', "sh"]
    env = {**os.environ, "PYTHONHASHSEED": "0"}  # set/dict order steers coverage, hence the mutations
    proc = subprocess.run(
        launcher + argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=FUZZ_SECONDS * 10 + 30
    )
    log = proc.stderr + proc.stdout
    artifacts = [p.name for p in tmp_path.iterdir() if p.name != "corpus"]
    assert proc.returncode == 0 and not artifacts, (
        f"fuzz_{target} failed (exit {proc.returncode}); reproducer(s) {artifacts} in {tmp_path}; "
        f"replay with: python -m fuzz.fuzz_{target} <file>\n{log[-6000:]}"
    )
    runs = _last(r"Done (\d+) runs", log)
    rss = _last(r"rss: (\d+)Mb", log)
    assert runs is not None and int(runs) >= 50, f"fuzz_{target} barely ran:\n{log[-3000:]}"
    assert rss is not None and int(rss) < RSS_LIMIT_MB
    print(f"fuzz_{target}: {runs} runs in {FUZZ_SECONDS} s, peak RSS {rss} MB")  # shown with -s / -rP


def _rss_kb() -> int:
    status = pathlib.Path("/proc/self/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1))  # type: ignore[union-attr]


@pytest.mark.parametrize("target", TARGETS)
def test_replay_does_not_grow_memory(target: str) -> None:
    """The corpus replayed 30 times: traced Python memory and RSS level off after a warm-up."""
    run = harness(target).test_one_input
    inputs = [p.read_bytes() for p in sorted((CORPUS / target).iterdir())]

    def replay(times: int) -> None:
        for _ in range(times):
            for data in inputs:
                run(data)
        gc.collect()

    replay(3)  # warm-up: caches, interned strings, lazily built tables
    tracemalloc.start()
    try:
        replay(2)
        before, _ = tracemalloc.get_traced_memory()
        rss_before = _rss_kb()
        replay(30)
        after, _ = tracemalloc.get_traced_memory()
        rss_after = _rss_kb()
    finally:
        tracemalloc.stop()
    assert after - before < 256 * 1024, f"traced memory grew by {after - before} bytes over 30 replays"
    assert rss_after - rss_before < 16 * 1024, f"RSS grew by {rss_after - rss_before} kB over 30 replays"
