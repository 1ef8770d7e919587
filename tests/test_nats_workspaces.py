"""Workspaces with scale-out: a worker announces its templates and placement honours a handshake's
``smith_fast.template``; a fork is placed on the worker that holds its checkpoint's layers; the
workspace lives on its worker (real nats-server, gateway and workers)."""

from __future__ import annotations

import pathlib
import shutil
import tempfile
from collections.abc import Iterator

import pytest

from smith_fast.client import Client
from smith_fast.errors import SmithError
from smith_fast.nats.placement import Placement
from smith_fast.nats.presence import Announcement

from harness.nats_cluster import Cluster


def test_placement_needs_the_template_among_the_workers_templates() -> None:
    def ann(worker: str, templates: tuple[str, ...]) -> Announcement:
        return Announcement(worker=worker, version="0.1.0", capacity=64, max_sessions=10, templates=templates)

    workers = [ann("a", ("py",)), ann("b", ("js", "py")), ann("c", ())]
    placement = Placement()
    assert placement.choose(workers, {"smith_fast.template": "js"}) == "b"
    assert placement.choose(workers, {"smith_fast.template": "rust"}) is None
    assert Announcement.decode(workers[1].encode()).templates == ("js", "py")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # workspaces and templates outside /tmp: a command's /tmp is private (see tests/test_workspaces.py)
    base = pathlib.Path(tempfile.mkdtemp(prefix="smith-fast-natsws-", dir="/var/tmp"))
    (base / "py").mkdir()
    (base / "py" / "which").write_text("py template\n")
    (base / "js").mkdir()
    (base / "js" / "which").write_text("js template\n")
    c = Cluster(tmp_path_factory.mktemp("nats-ws"), workers=0, roots=True,
                gateway_args=("--queue-timeout", "2", "--queue-notice", "0.5"))
    try:
        c.nats.start()
        c.add_worker("--workspaces", str(base / "ws0"), "--template", f"py={base / 'py'}")
        c.add_worker("--workspaces", str(base / "ws1"), "--template", f"js={base / 'js'}", "--template", f"py={base / 'py'}")
        c.gateway.start()
        c.wait_connected(2)
    except BaseException:
        c.stop()
        shutil.rmtree(base, ignore_errors=True)
        raise
    yield c
    codes = c.stop()
    shutil.rmtree(base, ignore_errors=True)
    assert set(codes.values()) == {0}, codes


async def test_a_template_lands_on_a_worker_that_has_it_and_a_fork_where_its_checkpoint_is(fleet: Cluster) -> None:
    for _ in range(3):
        async with await Client.connect(fleet.unix, template="js") as client:
            ready = await client.handshake(["shell_exec", "workspaces"])
            assert ready.service_info["smith_fast.worker"] == "w1"
            assert ready.service_info["smith_fast.template"] == "js"
            assert (await client.run("cat which")).stdout == b"js template\n"
    checkpoints: dict[str, str] = {}
    for _ in range(6):  # py is on both workers: take a checkpoint on each
        async with await Client.connect(fleet.unix, template="py") as client:
            ready = await client.handshake(["shell_exec", "workspaces"])
            worker = ready.service_info["smith_fast.worker"]
            await client.run(f"echo made on {worker} > origin")
            checkpoints.setdefault(worker, await client.checkpoint())
        if len(checkpoints) == 2:
            break
    for worker, checkpoint in checkpoints.items():
        for _ in range(3):
            async with await Client.connect(fleet.unix, fork=checkpoint) as client:
                ready = await client.handshake(["shell_exec", "workspaces"])
                assert ready.service_info["smith_fast.worker"] == worker
                assert (await client.run("cat origin")).stdout == f"made on {worker}\n".encode()


async def test_no_worker_has_the_template(fleet: Cluster) -> None:
    async with await Client.connect(fleet.unix, template="rust") as client:
        with pytest.raises(SmithError) as caught:
            await client.handshake(["shell_exec", "workspaces"])
        assert caught.value.details.get("reason") == "no_worker"
