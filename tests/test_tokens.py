"""Recordings, tokens and defaults, against real processes: neither the service's token nor
a session's resume token is written anywhere (recordings, logs, metrics), found by grepping every
artefact of sessions that used both, through a NATS gateway too; recordings are private,
bounded (``--record-max-bytes``, oldest removed first) and ``replay`` is granted only when the
operator lists it; a TCP listener without a token is warned about."""

from __future__ import annotations

import os
import pathlib
import stat
import subprocess
import sys
import urllib.request
import uuid

import pytest

from smith_fast.pb import smith_pb2 as pb
from smith_fast.replay import read_log

from .peers import V1Peer, errors, kind, terminal
from harness.server import ServerProcess, assert_clean_log, beside, wait_until

TOKEN = "svc-token-5b2e9d41c07a4f3e"
RESUME = {"smith_fast.accept": "resume"}


def every_file(top: pathlib.Path) -> list[pathlib.Path]:
    return [p for p in top.rglob("*") if p.is_file() and not p.is_socket()]


def leaks(top: pathlib.Path, secrets: list[str]) -> list[str]:
    """Files under ``top`` holding one of ``secrets`` (as UTF-8 bytes), as ``path: secret``."""
    found = []
    for path in every_file(top):
        data = path.read_bytes()
        found += [f"{path}: {s}" for s in secrets if s.encode() in data]
    return found


def shell(peer: V1Peer, command: str) -> str:
    rid = str(uuid.uuid4())
    peer.command(shell_exec=pb.ShellExecCommand(request_id=rid, command=command))
    envs = peer.until(terminal(rid))
    assert envs[-1].event.state_change.state == pb.SERVICE_STATE_READY, errors(envs)
    peer.last = max(e.sequence for e in envs)  # type: ignore[attr-defined]  # what a resume starts after
    return "".join(e.event.shell_output.stdout for e in envs)


def resumable(address: str) -> tuple[V1Peer, str, int]:
    """A session that presented TOKEN and asked for resume: the peer, its resume token, the last sequence."""
    peer = V1Peer(address)
    envs = peer.handshake((pb.CAPABILITY_SHELL_EXEC, pb.CAPABILITY_REPLAY), token=TOKEN, **RESUME)
    envs += peer.until(lambda e: kind(e) == "state_change" and not e.event.state_change.request_id)
    (ready,) = [e.event.ready for e in envs if kind(e) == "ready"]
    assert ready.resume_token and pb.CAPABILITY_REPLAY in ready.capabilities
    return peer, ready.resume_token, max(e.sequence for e in envs)


@pytest.mark.parametrize("where", ["record", "state-dir"])
def test_no_token_is_written_anywhere(tmp_path: pathlib.Path, where: str) -> None:
    """Sessions that present the token, get a resume token, echo both in commands, drop and resume;
    then every recording (``--record DIR``'s, or, without it, those of the sessions granted
    ``replay`` in ``--state-dir``), every log line and the metrics are grepped."""
    state = tmp_path / "state"
    recordings = tmp_path / "rec" if where == "record" else state / "recordings"
    srv = ServerProcess(
        tmp_path, *(["--record", str(recordings)] if where == "record" else []), "--state-dir", str(state),
        "--capabilities", "shell_exec,replay", "--metrics", "127.0.0.1:0", env={"SMITH_TOKEN": TOKEN}, root=tmp_path / "root",
    )
    (tmp_path / "root").mkdir()
    srv.start()
    secrets = [TOKEN]
    try:
        peer, resume_token, _ = resumable(srv.unix)
        secrets.append(resume_token)
        # the peer sends both secrets in a command and gets them back in output: masked in the
        # recording, and the service's token in the audit line too
        assert shell(peer, f"echo {TOKEN} {resume_token}") == f"{TOKEN} {resume_token}\n"
        peer.close()  # dropped: parked for --resume-window
        again = V1Peer(srv.unix)
        again.command(handshake=pb.HandshakeCommand(
            version=1, resume_token=resume_token, resume_after=peer.last, client_info={"token": TOKEN}))  # type: ignore[attr-defined]
        resumed = again.until(lambda e: kind(e) == "ready")
        assert resumed[-1].event.ready.resumed
        assert shell(again, "echo resumed") == "resumed\n"
        again.handshake((pb.CAPABILITY_SHELL_EXEC,), token=TOKEN, **RESUME)  # a second Ready, the token again
        with urllib.request.urlopen(srv.metrics_url, timeout=10) as answer:
            metrics = answer.read().decode()
        again.close()
    finally:
        assert srv.stop() == 0
    assert_clean_log(srv)
    files = every_file(recordings)
    assert files and all(p.suffix == ".smithrec" for p in files)
    assert not leaks(tmp_path, secrets)  # the recordings, the state directory, the workspace
    assert not [line for line in srv.raw_stderr if TOKEN in line]
    # the resume token is logged nowhere but in the audit line of the command the peer typed it in
    assert [line for line in srv.raw_stderr if resume_token in line] == [
        line for line in srv.raw_stderr if '"smith_fast.audit"' in line and "echo <redacted>" in line]
    assert not any(s in metrics for s in secrets)
    # the recordings are still whole, the Ready's token masked in place
    readies = []
    for path in files:
        header, records, torn = read_log(path)
        assert torn is None
        for record in records:
            env = record.parse()
            if env.HasField("event") and env.event.WhichOneof("event_type") == "ready" and env.event.ready.resume_token:
                readies.append(env.event.ready.resume_token)
    assert readies and all(t.startswith("<redacted>") and len(t) == len(resume_token) for t in readies)
    # private: the directories 0700, the files 0600
    assert stat.S_IMODE(recordings.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files)


def test_a_recordings_directory_others_may_enter_is_refused(tmp_path: pathlib.Path) -> None:
    rec = tmp_path / "rec"
    rec.mkdir()
    os.chmod(rec, 0o755)
    (tmp_path / "root").mkdir()
    res = subprocess.run([sys.executable, "-m", "smith_fast", "serve", "--unix", str(tmp_path / "s.sock"), "--record", str(rec),
                          "--root", str(tmp_path / "root")], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert "is open to other users (mode 0755)" in res.stderr and f"chmod 700 {rec}" in res.stderr


def test_replay_is_granted_only_when_the_operator_lists_it(tmp_path: pathlib.Path) -> None:
    state = beside(tmp_path, "state")  # not in the root (the service refuses that)
    srv = ServerProcess(tmp_path, "--state-dir", str(state)).start()
    try:
        peer = V1Peer(srv.unix)
        peer.command(handshake=pb.HandshakeCommand(version=1, capabilities=[pb.CAPABILITY_SHELL_EXEC, pb.CAPABILITY_REPLAY]))
        envs = peer.until(lambda e: kind(e) == "ready")
        assert list(envs[-1].event.ready.capabilities) == [pb.CAPABILITY_SHELL_EXEC]
        (err,) = errors(envs)
        assert err.details["capability"] == "replay" and "not available" in err.message
        assert shell(peer, "echo x") == "x\n"
        peer.close()
    finally:
        assert srv.stop() == 0
    assert not state.exists()  # nothing recorded, nothing made


def test_recordings_are_bounded_oldest_removed_first(tmp_path: pathlib.Path) -> None:
    rec = beside(tmp_path, "rec")
    srv = ServerProcess(tmp_path, "--record", str(rec), "--record-max-bytes", "256k").start()
    try:
        for i in range(12):  # ~60 KB each: 720 KB recorded in all
            peer = V1Peer(srv.unix)
            peer.handshake()
            assert len(shell(peer, f"head -c 60000 /dev/zero | tr '\\0' '{i % 10}'")) == 60000
            peer.close()
            assert wait_until(lambda: len(srv.logs) and sum(p.stat().st_size for p in rec.iterdir()) <= 256 * 1024)
        # one session alone past the bound: its recording stops with a warning, the session goes on
        big = V1Peer(srv.unix)
        big.handshake()
        rid = str(uuid.uuid4())
        big.command(shell_exec=pb.ShellExecCommand(request_id=rid, command="head -c 600000 /dev/zero | tr '\\0' x"))
        envs = big.until(terminal(rid))
        assert envs[-1].event.state_change.state == pb.SERVICE_STATE_READY
        assert sum(len(e.event.shell_output.stdout) for e in envs) == 600000
        warnings = [e.event.log for e in envs if kind(e) == "log" and e.event.log.fields.get("reason") == "recording_failed"]
        assert len(warnings) == 1 and "--record-max-bytes" in warnings[0].message
        assert shell(big, "echo on") == "on\n"
        big.close()
        still = V1Peer(srv.unix)
        still.handshake()
        assert shell(still, "echo recorded") == "recorded\n"
        still.close()
    finally:
        assert srv.stop() == 0
    assert_clean_log(srv)
    files = sorted(rec.iterdir())
    assert sum(p.stat().st_size for p in files) <= 256 * 1024
    assert any(r.get("event") == "recording removed" for r in srv.logs)
    # the newest recordings are the ones kept: the last session's is there
    newest = read_log(files[-1])[1]
    assert any(b"recorded" in r.envelope for r in newest)


def test_a_tcp_listener_without_a_token_is_warned_about(tmp_path: pathlib.Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    open_ = ServerProcess(tmp_path / "a").start()
    guarded = ServerProcess(tmp_path / "b", env={"SMITH_TOKEN": TOKEN}).start()
    try:
        (warning,) = [r for r in open_.logs if r.get("event") == "TCP listener without a token"]
        assert warning["level"] == "warning" and warning["address"] == open_.tcp
        assert "any local account" in warning["risk"] and "run commands" in warning["risk"]
        assert "SMITH_TOKEN" in warning["remedy"]
        assert not [r for r in guarded.logs if r.get("event") == "TCP listener without a token"]
    finally:
        assert open_.stop() == 0 and guarded.stop() == 0


def _resumed_through(address: str) -> str:
    """A session through ``address`` that presents TOKEN and asks for resume, runs a command, drops
    and is resumed, then runs another; its resume token."""
    peer = V1Peer(address)
    envs = peer.handshake((pb.CAPABILITY_SHELL_EXEC,), token=TOKEN, **RESUME)
    (ready,) = [e.event.ready for e in envs if kind(e) == "ready"]
    resume_token = ready.resume_token
    assert resume_token
    # (neither secret is echoed in a command here: a command's text is the peer's, and goes to the worker as it is)
    assert shell(peer, "echo relayed") == "relayed\n"
    peer.close()  # dropped: parked on its worker for --resume-window
    again = V1Peer(address)
    again.command(handshake=pb.HandshakeCommand(
        version=1, resume_token=resume_token, resume_after=peer.last, client_info={"token": TOKEN}))  # type: ignore[attr-defined]
    assert again.until(lambda e: kind(e) == "ready")[-1].event.ready.resumed
    assert shell(again, "echo resumed") == "resumed\n"
    again.close()
    return resume_token


@pytest.mark.timeout(180)
def test_no_token_is_written_down_through_a_gateway(tmp_path: pathlib.Path) -> None:
    """Through a gateway, a session that presents the token and asks for resume, drops and is
    resumed through the gateway: neither token is in a log line of the gateway or the worker, nor
    in a file under the test's directory (the NATS store and log, the workspace). That the
    service's token never travels on NATS at all: test_nats_attacks.py."""
    from harness.nats_cluster import Cluster

    cluster = Cluster(tmp_path, workers=1)
    cluster.gateway.env["SMITH_TOKEN"] = TOKEN
    cluster.start()
    try:
        resume_token = _resumed_through(cluster.unix)
        logs = list(cluster.gateway.raw_stderr) + [line for w in cluster.workers for line in w.raw_stderr]
    finally:
        cluster.stop()
    assert any(p.stat().st_size for p in every_file(tmp_path)), "nothing was written under the test's directory"
    assert not leaks(tmp_path, [TOKEN, resume_token])
    assert logs and not [line for line in logs if TOKEN in line or resume_token in line]
