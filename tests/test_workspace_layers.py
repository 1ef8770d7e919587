"""smith_fast.workspaces.layers on real overlay layers: the kernel writes each upper (through an
overlay mounted in a child's own user and mount namespace, tests/overlay_fixture.py), the functions
read it as a plain directory afterwards, and their answers are checked against what the kernel
shows through the mount (the merged trees, walked inside the child)."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from smith_fast.errors import ProtocolError
from smith_fast.workspaces import ChangeSet, FileChange
from smith_fast.workspaces import layers
from smith_fast.workspaces.layers import diff, is_opaque, is_whiteout, layer_changes, lookup, merge, restore_paths

from .overlay_fixture import on_overlay

Tree = dict[str, tuple[Any, ...]]


def make(root: Path, spec: dict[str, str | None]) -> Path:
    """A plain directory: ``name: text`` a file, ``name/: None`` a directory, ``name@: target`` a symlink."""
    root.mkdir(parents=True, exist_ok=True)
    for name, value in spec.items():
        if name.endswith("/"):
            (root / name).mkdir(parents=True, exist_ok=True)
        elif name.endswith("@"):
            (root / name[:-1]).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(str(value), root / name[:-1])
        else:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(str(value))
    return root


def tree(root: str) -> Tree:
    """Every path beneath ``root``: (type, mode, size, sha256 or symlink target); dirs have size 0."""
    out: Tree = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            st = os.lstat(path)
            if stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", st.st_mode, 0, "")
            elif stat.S_ISLNK(st.st_mode):
                out[rel] = ("symlink", st.st_mode, st.st_size, os.readlink(path))
            else:
                out[rel] = ("file", st.st_mode, st.st_size, hashlib.sha256(Path(path).read_bytes()).hexdigest())
    return out


def oracle(before: Tree, after: Tree) -> list[tuple[str, str, int, int, str]]:
    """The changes from one merged tree to another, by the rules of layers (from full walks)."""
    out = []
    for path in sorted(before.keys() | after.keys(), key=layers.path_key):
        old, new = before.get(path), after.get(path)
        if old is None:
            assert new is not None
            out.append((path, "added", new[2], 0, new[0]))
        elif new is None:
            out.append((path, "deleted", 0, old[2], old[0]))
        elif old != new:
            out.append((path, "modified", new[2], old[2], new[0]))
    return out


def facts(changes: ChangeSet) -> list[tuple[str, str, int, int, str]]:
    return [(c.path, c.kind, c.size, c.old_size, c.file_type) for c in changes.changes]


def layer(lowers: list[Path], upper: Path, ops: Callable[[str], None]) -> Tree:
    """Run ``ops`` on the overlay of ``upper`` over ``lowers`` (top first): the merged tree after."""

    def run(mnt: str) -> Tree:
        ops(mnt)
        return tree(mnt)

    result: Tree = on_overlay([str(p) for p in lowers], str(upper), run)
    return result


def test_lookup_honours_whiteouts_opaque_dirs_and_files_over_dirs(tmp_path: Path) -> None:
    t = make(tmp_path / "T", {"a/x": "x", "a/y": "y", "b/z": "z", "c/d/e": "e", "f/g": "g", "h": "h"})
    l1 = tmp_path / "L1"

    def ops(m: str) -> None:
        os.unlink(f"{m}/a/x")  # a whiteout inside a merged dir
        shutil.rmtree(f"{m}/c")  # an opaque dir: rm -rf then mkdir
        os.makedirs(f"{m}/c/d")
        Path(f"{m}/c/new").write_text("n")
        shutil.rmtree(f"{m}/f")  # a file where a dir was: hides f/g
        Path(f"{m}/f").write_text("file")
        shutil.rmtree(f"{m}/b")  # a whiteout over a whole dir
        os.unlink(f"{m}/h")  # a dir where a file was
        os.mkdir(f"{m}/h")

    probes = ["a", "a/x", "a/y", "b", "b/z", "c", "c/d", "c/d/e", "c/new", "f", "f/g", "h", "h/x", "nope", "a/y/q"]

    def run(m: str) -> dict[str, bool]:
        ops(m)
        return {p: os.path.lexists(f"{m}/{p}") for p in probes}

    seen = on_overlay([str(t)], str(l1), run)
    chain = [str(l1), str(t)]
    assert is_whiteout(os.lstat(l1 / "a/x")) and is_whiteout(os.lstat(l1 / "b"))
    assert is_opaque(str(l1 / "c")) and not is_opaque(str(l1 / "a"))
    for p in probes:  # the kernel's view, name by name
        assert (lookup(chain, p) is not None) == seen[p], p
    assert lookup(chain, "a/y") == f"{t}/a/y"
    assert lookup(chain, "a") == f"{l1}/a"  # the topmost layer that has it
    assert lookup(chain, "c/new") == f"{l1}/c/new"
    assert lookup(chain, "c/d/e") is None  # c is opaque: T's c/d does not show
    assert lookup(chain, "f/g") is None and lookup([str(t)], "f/g") == f"{t}/f/g"
    assert lookup(chain, "./a//y") == f"{t}/a/y"
    with pytest.raises(ProtocolError) as exc:
        lookup(chain, "../etc/passwd")
    assert exc.value.details == {"path": "../etc/passwd"}


def test_layer_changes_reports_exactly_what_the_commands_did(tmp_path: Path) -> None:
    t = make(tmp_path / "T", {"b": "b\n", "c": "ccc\n", "keep": "same", "touched": "t", "big/": None})
    u = tmp_path / "U"

    def ops(m: str) -> None:
        Path(f"{m}/a").touch()
        with open(f"{m}/b", "a") as f:
            f.write("x\n")
        os.unlink(f"{m}/c")
        os.mkdir(f"{m}/d")
        os.symlink("a", f"{m}/e")
        with open(f"{m}/keep", "r+"):  # opened for writing, nothing written: a copy-up for nothing
            pass
        os.utime(f"{m}/touched", ns=(1, os.stat(f"{m}/touched").st_mtime_ns))  # touch -a

    layer([t], u, ops)
    assert (u / "keep").exists() and (u / "touched").exists()  # the kernel did copy them up
    got = layer_changes(str(u), [str(t)])
    assert facts(got) == [
        ("a", "added", 0, 0, "file"),
        ("b", "modified", 4, 2, "file"),
        ("c", "deleted", 0, 4, "file"),
        ("d", "added", 0, 0, "dir"),
        ("e", "added", 1, 0, "symlink"),
    ]
    assert got.exact and not got.truncated


def test_layer_changes_of_opaque_dirs_replacements_and_renames_match_the_kernels_view(tmp_path: Path) -> None:
    t = make(
        tmp_path / "T",
        {
            "dir/old1": "1",
            "dir/old2": "22",
            "dir/sub/deep": "deep",
            "dir/same": "s",
            "gone/x/y": "y",
            "f2d": "file",
            "d2f/inner": "i",
            "mv/src": "moved",
            "mode": "m",
            "link@": "mode",
            "plain/kept": "k",
        },
    )
    before = tree(str(t))
    u = tmp_path / "U"

    def ops(m: str) -> None:
        shutil.rmtree(f"{m}/dir")
        os.mkdir(f"{m}/dir")
        Path(f"{m}/dir/new").touch()
        Path(f"{m}/dir/same").write_text("s")  # same bytes and mode as before: no change
        shutil.rmtree(f"{m}/gone")
        os.unlink(f"{m}/f2d")
        os.makedirs(f"{m}/f2d/in")
        shutil.rmtree(f"{m}/d2f")
        Path(f"{m}/d2f").write_text("now a file")
        os.rename(f"{m}/mv/src", f"{m}/mv/dst")
        os.chmod(f"{m}/mode", 0o600)
        os.unlink(f"{m}/link")
        os.symlink("elsewhere", f"{m}/link")
        os.chmod(f"{m}/plain", 0o700)

    after = layer([t], u, ops)
    assert is_opaque(str(u / "dir"))
    got = layer_changes(str(u), [str(t)])
    assert facts(got) == oracle(before, after)
    paths = {c.path: c.kind for c in got.changes}
    assert paths["dir/old1"] == paths["dir/sub"] == paths["dir/sub/deep"] == "deleted"
    assert paths["dir/new"] == "added" and "dir/same" not in paths and "dir" not in paths
    assert paths["gone"] == paths["gone/x"] == paths["gone/x/y"] == "deleted"
    assert paths["f2d"] == "modified" and paths["f2d/in"] == "added"
    assert paths["d2f"] == "modified" and paths["d2f/inner"] == "deleted"
    assert paths["mv/src"] == "deleted" and paths["mv/dst"] == "added"
    assert paths["plain"] == "modified" and "plain/kept" not in paths

    cut = layer_changes(str(u), [str(t)], limit=3)
    assert cut.truncated and cut.changes == got.changes[:3]


def test_layer_changes_over_a_stack_of_frozen_layers(tmp_path: Path) -> None:
    t = make(tmp_path / "T", {"a/x": "x", "a/y": "y", "b": "b", "p/o/hidden/h": "h", "p/o/kept": "k"})
    l1, l2 = tmp_path / "L1", tmp_path / "L2"

    def first(m: str) -> None:
        os.unlink(f"{m}/a/x")
        Path(f"{m}/a/n").write_text("n")
        shutil.rmtree(f"{m}/p/o")  # opaque in L1: T's p/o/hidden must not come back in L2's deletion
        os.mkdir(f"{m}/p/o")
        Path(f"{m}/p/o/new").write_text("new")

    mid = layer([t], l1, first)

    def ops(m: str) -> None:
        shutil.rmtree(f"{m}/p")
        Path(f"{m}/a/x").write_text("back")  # over L1's whiteout: an opaque-making create
        os.unlink(f"{m}/a/n")  # a whiteout over an upper file
        shutil.rmtree(f"{m}/a")  # then all of it
        os.mkdir(f"{m}/a")
        Path(f"{m}/a/y").write_text("y")

    after = layer([l1, t], l2, ops)
    got = layer_changes(str(l2), [str(l1), str(t)])
    assert facts(got) == oracle(mid, after)
    assert [c.path for c in got.changes if c.path.startswith("p")] == ["p", "p/o", "p/o/new"]


def test_diff_walks_only_the_layers_the_chains_do_not_share(tmp_path: Path) -> None:
    spec: dict[str, str | None] = {f"pkg{i // 100}/f{i}.txt": f"line {i}\n" for i in range(2000)}
    spec.update({"dir/a": "a\n", "dir/b": "b\n"})
    t = make(tmp_path / "T", spec)
    l1, l2a, l2b = tmp_path / "L1", tmp_path / "L2a", tmp_path / "L2b"
    base = layer([t], l1, lambda m: Path(f"{m}/pkg1/f100.txt").write_text("changed\n") and None)

    def ops_a(m: str) -> None:
        Path(f"{m}/only_a").write_text("a\n")
        Path(f"{m}/pkg2/f200.txt").write_text("from a\n")

    def ops_b(m: str) -> None:
        shutil.rmtree(f"{m}/dir")  # opaque in b: T's dir/a and dir/b gone, dir/c new
        os.mkdir(f"{m}/dir")
        Path(f"{m}/dir/c").write_text("c\n")
        Path(f"{m}/pkg2/f200.txt").write_text("from b\n")
        os.unlink(f"{m}/pkg3/f300.txt")

    tree_a = layer([l1, t], l2a, ops_a)
    tree_b = layer([l1, t], l2b, ops_b)
    chain_a, chain_b = [str(l2a), str(l1), str(t)], [str(l2b), str(l1), str(t)]
    scanned = layers.entries_scanned()
    got = diff(chain_a, chain_b, max_diff_bytes=1 << 16)
    walked = layers.entries_scanned() - scanned
    assert facts(got) == oracle(tree_a, tree_b)
    # the two tops (a handful of entries) and the listing of T's dir that b's opaque dir hides:
    # nowhere near T's 2,000 files
    assert walked < 30, walked
    by_path = {c.path: c for c in got.changes}
    assert by_path["pkg2/f200.txt"].unified_diff == (
        "--- a/pkg2/f200.txt\n+++ b/pkg2/f200.txt\n@@ -1 +1 @@\n-from a\n+from b\n"
    )
    assert by_path["only_a"].unified_diff == "--- a/only_a\n+++ b/only_a\n@@ -1 +0,0 @@\n-a\n"

    # from the template: what L1 and L2b changed together, as the per-layer answers say
    whole = diff([str(t)], chain_b, max_diff_bytes=0)
    assert facts(whole) == oracle(tree(str(t)), tree_b)
    assert all(c.unified_diff == "" for c in whole.changes)

    # only beneath some paths: an opaque ancestor still shows what it hides there
    some = diff(chain_a, chain_b, max_diff_bytes=0, paths=["dir/a", "pkg3/"])
    assert facts(some) == [("dir/a", "deleted", 0, 2, "file"), ("pkg3/f300.txt", "deleted", 0, 9, "file")]
    assert facts(diff([str(l1), str(t)], [str(l1), str(t)], max_diff_bytes=100)) == []
    assert base != tree_b


def test_diff_of_text_files_is_bounded(tmp_path: Path) -> None:
    big = "".join(f"line {i:07d} of a big text file\n" for i in range(2 * 1024 * 1024 // 32))
    t = make(tmp_path / "T", {"big.txt": big, "s1": "one\n", "s2": "two\n", "s3": "three\n", "bin": "x"})
    u = tmp_path / "U"

    def ops(m: str) -> None:
        Path(f"{m}/big.txt").write_text(big.replace("line 0000100 ", "LINE 0000100 "))
        for name in ("s1", "s2", "s3"):
            Path(f"{m}/{name}").write_text("changed\n")
        Path(f"{m}/bin").write_bytes(b"a\x00b")
        Path(f"{m}/nolf").write_text("no newline")

    layer([t], u, ops)
    assert (u / "big.txt").stat().st_size >= 2 * 1024 * 1024
    a, b = [str(t)], [str(u), str(t)]
    got = diff(a, b, max_diff_bytes=64 * 1024)
    by_path = {c.path: c for c in got.changes}
    assert got.truncated and by_path["big.txt"].kind == "modified" and by_path["big.txt"].unified_diff == ""
    assert by_path["bin"].unified_diff == ""
    assert by_path["s1"].unified_diff == "--- a/s1\n+++ b/s1\n@@ -1 +1 @@\n-one\n+changed\n"
    assert by_path["nolf"].unified_diff.endswith("+no newline\n\\ No newline at end of file\n")

    # a budget that holds two small diffs: the third and later get none
    budget = len(by_path["bin"].unified_diff) + len(by_path["nolf"].unified_diff) + len(by_path["s1"].unified_diff)
    small = diff(a, b, max_diff_bytes=budget + 10, paths=["s1", "s2", "s3", "nolf"])
    assert small.truncated
    assert [bool(c.unified_diff) for c in small.changes] == [True, True, False, False]  # nolf, s1, s2, s3
    assert not diff(a, b, max_diff_bytes=1 << 20, paths=["s1", "s2", "s3", "nolf", "bin"]).truncated

    # within the budget, the big file's diff is small: its one changed line, with its context
    whole = diff(a, b, max_diff_bytes=4 << 20, paths=["big.txt"])
    text = whole.changes[0].unified_diff
    assert "-line 0000100 of" in text and "+LINE 0000100 of" in text and len(text) < 1000


def test_merge_of_two_layers_shows_the_same_tree(tmp_path: Path) -> None:
    t = make(
        tmp_path / "T",
        {"a/x": "x", "a/y": "y", "b/z": "z", "c": "c", "d/e/f": "f", "g": "g", "link@": "c", "keep/k": "k"},
    )
    l1, l2 = tmp_path / "L1", tmp_path / "L2"

    def ops1(m: str) -> None:
        os.unlink(f"{m}/a/x")
        Path(f"{m}/a/new1").write_text("n1")
        shutil.rmtree(f"{m}/b")
        Path(f"{m}/c").write_text("c1")
        shutil.rmtree(f"{m}/d")
        os.makedirs(f"{m}/d/e")
        Path(f"{m}/d/e/l1").write_text("l1")
        os.unlink(f"{m}/g")
        os.mkdir(f"{m}/l1dir")
        Path(f"{m}/l1dir/q").write_text("q")

    def ops2(m: str) -> None:
        Path(f"{m}/a/x").write_text("x again")  # over L1's whiteout
        os.mkdir(f"{m}/b")  # a dir over L1's whiteout of a dir: must stay opaque after the merge
        Path(f"{m}/b/w").write_text("w")
        os.unlink(f"{m}/c")  # a whiteout over L1's file: hides T's too
        shutil.rmtree(f"{m}/l1dir")
        os.mkdir(f"{m}/g")  # a dir over L1's whiteout of a file
        os.chmod(f"{m}/a", 0o750)
        os.unlink(f"{m}/link")
        os.symlink("a/x", f"{m}/link")
        Path(f"{m}/d/e/l2").write_text("l2")

    layer([t], l1, ops1)
    stacked = layer([l1, t], l2, ops2)
    out = tmp_path / "M"
    merge(str(l1), str(l2), str(out))
    merged = on_overlay([str(out), str(t)], str(tmp_path / "R"), lambda m: tree(m))
    assert merged == stacked
    assert os.stat(out / "a/x").st_ino == os.stat(l2 / "a/x").st_ino  # linked, not copied
    assert os.stat(out / "a/new1").st_ino == os.stat(l1 / "a/new1").st_ino
    assert is_whiteout(os.lstat(out / "c"))
    assert os.lstat(out / "link").st_ino == os.lstat(l2 / "link").st_ino
    assert is_opaque(str(out / "b")) and is_opaque(str(out / "d"))
    assert (os.stat(out / "a").st_mode & 0o777) == 0o750
    assert os.stat(out / "a").st_mtime_ns == os.stat(l2 / "a").st_mtime_ns
    # the merged layer's changes are the two layers' together
    assert facts(layer_changes(str(out), [str(t)])) == oracle(tree(str(t)), stacked)
    with pytest.raises(FileExistsError):
        merge(str(l1), str(l2), str(out))


def test_restore_paths_puts_a_request_back(tmp_path: Path) -> None:
    t = make(
        tmp_path / "T",
        {"f": "orig", "gone": "g", "d/x": "x", "d/y": "y", "s@": "f", "dir2file/in": "i", "keep": "k", "ro/f": "r"},
    )
    os.chmod(t / "f", 0o640)
    os.chmod(t / "ro", 0o555)  # filled again before its mode is put back
    os.utime(t / "f", ns=(1_000_000_000, 2_000_000_000))
    original = tree(str(t))
    l1, live = tmp_path / "L1", tmp_path / "U"
    outside = tmp_path / "outside"
    outside.mkdir()

    def request(m: str) -> None:
        Path(f"{m}/f").write_text("changed, longer")
        os.chmod(f"{m}/f", 0o600)
        os.unlink(f"{m}/gone")
        shutil.rmtree(f"{m}/d")
        os.symlink(str(outside), f"{m}/d")  # a symlink out where a dir was
        os.unlink(f"{m}/s")
        os.symlink("keep", f"{m}/s")
        shutil.rmtree(f"{m}/dir2file")
        Path(f"{m}/dir2file").write_text("file now")
        Path(f"{m}/new").write_text("new")
        os.makedirs(f"{m}/newdir/sub")
        os.chmod(f"{m}/ro", 0o755)
        shutil.rmtree(f"{m}/ro")

    layer([t], l1, request)
    changed = layer_changes(str(l1), [str(t)])
    paths = [c.path for c in changed.changes]

    def undo(m: str) -> tuple[Any, ...]:
        # no capability left, as in the service: a directory's mode binds (ro must be filled first)
        assert "CapEff:\t0000000000000000" in Path("/proc/self/status").read_text()
        refused = None
        try:
            restore_paths(m, ["d/x"], [str(t)])  # its parent is a symlink now: refused, not followed
        except OSError as exc:
            refused = exc.errno
        got = restore_paths(m, paths, [str(t)])
        again = restore_paths(m, paths, [str(t)])
        return refused, got, again, tree(m)

    refused, got, again, after = on_overlay([str(l1), str(t)], str(live), undo, drop_caps=True)
    assert refused == errno.ELOOP
    assert list(outside.iterdir()) == []
    assert after == original
    assert os.stat(lookup([str(live), str(l1), str(t)], "f") or "").st_mtime_ns == 2_000_000_000
    assert again == ChangeSet()
    undone = {c.path: c.kind for c in got.changes}
    assert undone == {
        "d": "modified",
        "d/x": "added",
        "d/y": "added",
        "dir2file": "modified",
        "dir2file/in": "added",
        "f": "modified",
        "gone": "added",
        "new": "deleted",
        "newdir": "deleted",
        "ro": "added",
        "ro/f": "added",
        "s": "modified",
    }
    assert FileChange("f", "modified", size=4, old_size=15, file_type="file") in got.changes


def test_layer_changes_of_a_small_layer_over_a_big_template_reads_only_the_layer(tmp_path: Path) -> None:
    t = make(tmp_path / "T", {f"d{i // 300}/f{i}": "x" for i in range(3_000)})
    u = tmp_path / "U"
    layer([t], u, lambda m: [Path(f"{m}/d{i}/new{i}").write_text("n") for i in range(10)] and None)
    scanned = layers.entries_scanned()
    got = layer_changes(str(u), [str(t)])
    assert layers.entries_scanned() - scanned == 20  # ten directories, ten files: the layer only
    assert [c.path for c in got.changes] == sorted(f"d{i}/new{i}" for i in range(10))
