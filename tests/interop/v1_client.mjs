#!/usr/bin/env node
// A whole Smith v1 session framed by protobufjs, not by smith-fast: proof that the service's wire
// format is protobuf's standard delimited format (PROTOCOL.md, "v1: varint-delimited Envelopes").
//
// The schema is loaded from proto/smith/v1/smith.proto at run time (no generated code), and every
// byte on the socket goes through Envelope.encodeDelimited / Envelope.decodeDelimited.
//
// Usage: node tests/interop/v1_client.mjs SOCKET READ_PATH
//   SOCKET     the service's Unix socket path
//   READ_PATH  a file for fs.read, relative to the service's --root
// Prints one JSON summary object on stdout. Exit status: 0 when the session went exactly as
// PROTOCOL.md says, 1 on any protocol surprise (the reason on stderr, the partial summary on
// stdout with "ok": false), 2 on bad usage.

import { randomUUID } from "node:crypto";
import net from "node:net";
import { fileURLToPath } from "node:url";
import { createRequire } from "node:module";
import protobuf from "protobufjs";

const PROTO = fileURLToPath(new URL("../../proto/smith/v1/smith.proto", import.meta.url));
const RECV_TIMEOUT_MS = 15_000;
// Both ends share this machine's clock; the slack only absorbs scheduling delays.
const CLOCK_SLACK_MS = 5_000;
const SHELL_COMMAND = "printf 'a\\nb\\n'; echo err >&2; exit 4";
const UNKNOWN_TOOL = "no.such.tool";

class Surprise extends Error {}

function expect(cond, what) {
  if (!cond) throw new Surprise(what);
}

// uint64 fields decode to Long when the `long` package is present; timestamps (ms) and sequence
// numbers fit a double exactly.
function num(v) {
  return typeof v === "number" ? v : v.toNumber();
}

const has = (msg, field) => Object.prototype.hasOwnProperty.call(msg, field);

const [socketPath, readPath] = process.argv.slice(2);
if (!socketPath || !readPath) {
  process.stderr.write("usage: node v1_client.mjs SOCKET READ_PATH\n");
  process.exit(2);
}

const root = await protobuf.load(PROTO);
const Envelope = root.lookupType("smith.v1.Envelope");
const ServiceState = root.lookupEnum("smith.v1.ServiceState");
const Capability = root.lookupEnum("smith.v1.Capability");
const ErrorCode = root.lookupEnum("smith.v1.ErrorCode");
const stateName = (n) => ServiceState.valuesById[n];

/** Envelopes in and out of one socket; every frame is protobufjs's delimited format. */
class Session {
  constructor(sock) {
    this.sock = sock;
    this.pending = Buffer.alloc(0);
    this.queue = [];
    this.waiter = null;
    this.closed = false;
    this.error = null;
    this.sent = [];
    this.received = [];
    this.nextSequence = 1;
    sock.on("data", (chunk) => this.onData(chunk));
    sock.on("error", (err) => { this.error = err; this.wake(); });
    sock.on("close", () => { this.closed = true; this.wake(); });
  }

  onData(chunk) {
    this.pending = Buffer.concat([this.pending, chunk]);
    for (;;) {
      // Peek at the length prefix to know whether a whole frame has arrived; a truncated varint
      // makes protobufjs's Reader throw RangeError, which here only means "wait for more bytes".
      const peek = protobuf.Reader.create(this.pending);
      let length;
      try {
        length = peek.uint32();
      } catch (err) {
        if (err instanceof RangeError) break;
        throw err;
      }
      if (this.pending.length < peek.pos + length) break;
      const reader = protobuf.Reader.create(this.pending);
      let env;
      try {
        env = Envelope.decodeDelimited(reader);
      } catch (err) {
        this.error = new Surprise(`frame ${this.received.length + 1} is not a valid Envelope: ${err.message}`);
        this.sock.destroy();
        this.wake();
        return;
      }
      this.pending = this.pending.subarray(reader.pos);
      this.received.push(env);
      this.queue.push(env);
    }
    this.wake();
  }

  wake() {
    if (this.waiter) {
      const w = this.waiter;
      this.waiter = null;
      w();
    }
  }

  send(command) {
    const env = Envelope.create({ timestamp: Date.now(), sequence: this.nextSequence++, command });
    const invalid = Envelope.verify(env);
    expect(invalid === null, `bad outgoing envelope: ${invalid}`);
    this.sock.write(Envelope.encodeDelimited(env).finish());
    this.sent.push(env);
  }

  /** The next envelope; null once the service closed the connection. */
  async next() {
    const deadline = Date.now() + RECV_TIMEOUT_MS;
    while (this.queue.length === 0) {
      if (this.error) throw this.error;
      if (this.closed) {
        expect(this.pending.length === 0, `connection closed inside a frame (${this.pending.length} bytes left)`);
        return null;
      }
      const left = deadline - Date.now();
      expect(left > 0, `no envelope from the service within ${RECV_TIMEOUT_MS} ms`);
      await new Promise((resolve) => {
        const timer = setTimeout(resolve, left);
        this.waiter = () => { clearTimeout(timer); resolve(); };
      });
    }
    return this.queue.shift();
  }

  /** The next event, checked to be one (service → client envelopes carry `event`). */
  async event() {
    const env = await this.next();
    expect(env !== null, "the service closed the connection mid-session");
    expect(env.payload === "event",
      `envelope ${this.received.length} (sequence ${num(env.sequence)}) carries ${env.payload ?? "no payload"}, not event`);
    return env.event;
  }

  /** Events for one request, up to and including its terminal StateChange (PROTOCOL.md, Sessions 3). */
  async request(requestId) {
    const events = [];
    for (;;) {
      const ev = await this.event();
      const body = ev[ev.eventType];
      expect(body.requestId === requestId,
        `${ev.eventType} for request ${JSON.stringify(body.requestId)} while waiting on ${requestId}`);
      events.push(ev);
      if (ev.eventType === "stateChange" && ev.stateChange.state !== ServiceState.values.SERVICE_STATE_PROCESSING) {
        return events;
      }
    }
  }
}

function states(events) {
  return events.filter((e) => e.eventType === "stateChange").map((e) => stateName(e.stateChange.state));
}

function decodeJsonBytes(bytes, what) {
  const text = new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new Surprise(`${what} is not JSON: ${err.message}`);
  }
}

async function run(session, summary) {
  const started = summary.client.started_ms;

  // 1. Handshake: StateChange(STARTING), Ready, StateChange(READY).
  session.send({
    handshake: {
      version: 1,
      capabilities: [Capability.values.CAPABILITY_SHELL_EXEC],
      clientInfo: { client: "smith-fast interop (protobufjs)" },
    },
  });
  const hs = [await session.event(), await session.event(), await session.event()];
  expect(hs.map((e) => e.eventType).join() === "stateChange,ready,stateChange",
    `handshake answered with ${hs.map((e) => e.eventType).join(", ")}`);
  expect(!has(hs[0].stateChange, "requestId") && !has(hs[2].stateChange, "requestId"),
    "handshake state changes carry a request id");
  const ready = hs[1].ready;
  summary.handshake = {
    states: states(hs),
    ready: {
      version: ready.version,
      capabilities: ready.capabilities.map((c) => Capability.valuesById[c]),
      service_id: ready.serviceId,
      service_info: { ...ready.serviceInfo },
    },
  };

  // 2. ShellExec: ShellOutput chunks, one final event with the exit code, a terminal StateChange.
  const shellId = randomUUID();
  session.send({ shellExec: { requestId: shellId, command: SHELL_COMMAND } });
  const shell = await session.request(shellId);
  let stdout = "";
  let stderr = "";
  const finals = [];
  let chunks = 0;
  for (const ev of shell) {
    if (ev.eventType === "stateChange") continue;
    expect(ev.eventType === "shellOutput", `unexpected ${ev.eventType} during ShellExec`);
    const out = ev.shellOutput;
    if (out.finished) {
      expect(has(out, "exitCode"), "final ShellOutput without exit_code");
      finals.push(out.exitCode);
    } else {
      expect(!has(out, "exitCode"), "exit_code on a ShellOutput that is not final");
      expect(has(out, "stdout") !== has(out, "stderr"), "a ShellOutput chunk must carry stdout or stderr");
      expect(finals.length === 0, "output after the final ShellOutput");
      chunks += 1;
    }
    if (has(out, "stdout")) stdout += out.stdout;
    if (has(out, "stderr")) stderr += out.stderr;
  }
  expect(finals.length === 1, `${finals.length} final ShellOutput events`);
  expect(shell.at(-2).eventType === "shellOutput" && shell.at(-2).shellOutput.finished,
    "the final ShellOutput is not the last event before the terminal state");
  summary.shell = {
    request_id: shellId,
    command: SHELL_COMMAND,
    states: states(shell),
    stdout,
    stderr,
    chunks,
    exit_code: finals[0],
  };

  // 3. ToolCall fs.read: args are UTF-8 JSON in bytes, so is the result.
  const toolId = randomUUID();
  session.send({ toolCall: { requestId: toolId, tool: "fs.read", args: Buffer.from(JSON.stringify({ path: readPath }), "utf8") } });
  const tool = await session.request(toolId);
  const results = tool.filter((e) => e.eventType === "toolResult").map((e) => e.toolResult);
  expect(results.length === 1 && tool.length === 3 && tool[1].eventType === "toolResult",
    `fs.read answered with ${tool.map((e) => e.eventType).join(", ")}`);
  const res = results[0];
  summary.tool = {
    request_id: toolId,
    tool: "fs.read",
    states: states(tool),
    success: res.success,
    error: has(res, "error") ? res.error : null,
    result: decodeJsonBytes(res.result, "ToolResult.result"),
    duration_ms: num(res.durationMs),
  };

  // 4. An unknown tool: ErrorEvent (INVALID_TOOL), then StateChange(ERROR).
  const badId = randomUUID();
  session.send({ toolCall: { requestId: badId, tool: UNKNOWN_TOOL, args: Buffer.from("{}", "utf8") } });
  const bad = await session.request(badId);
  const errors = bad.filter((e) => e.eventType === "error").map((e) => e.error);
  expect(errors.length === 1, `${errors.length} ErrorEvents for the unknown tool`);
  expect(bad.every((e) => e.eventType === "error" || e.eventType === "stateChange"),
    `unknown tool answered with ${bad.map((e) => e.eventType).join(", ")}`);
  const err = errors[0];
  const errTs = num(err.timestamp);
  expect(errTs >= started - CLOCK_SLACK_MS && errTs <= Date.now() + CLOCK_SLACK_MS, `ErrorEvent.timestamp ${errTs} implausible`);
  summary.unknown_tool = {
    request_id: badId,
    tool: UNKNOWN_TOOL,
    states: states(bad),
    error_code: ErrorCode.valuesById[err.errorCode],
    message: err.message,
    details: { ...err.details },
  };

  // 5. Shutdown: StateChange(SHUTTING), then the service closes the connection.
  session.send({ shutdown: {} });
  const shutting = await session.event();
  expect(shutting.eventType === "stateChange", `Shutdown answered with ${shutting.eventType}`);
  const trailing = [];
  for (let env = await session.next(); env !== null; env = await session.next()) {
    trailing.push(env.payload === "event" ? env.event.eventType : env.payload);
  }
  summary.shutdown = { states: states([shutting]), trailing, closed: session.closed };
  expect(trailing.length === 0, `after SHUTTING the service sent ${trailing.join(", ")}`);
}

/** Sequence numbers 1, 2, 3, ... with no gap; timestamps from this machine's clock, never going back. */
function checkEnvelopes(session, summary) {
  const finished = Date.now();
  const started = summary.client.started_ms;
  const sequences = session.received.map((e) => num(e.sequence));
  const timestamps = session.received.map((e) => num(e.timestamp));
  const stateTimestamps = session.received
    .filter((e) => e.payload === "event" && e.event.eventType === "stateChange")
    .map((e) => num(e.event.stateChange.timestamp));
  const plausible = (t) => t >= started - CLOCK_SLACK_MS && t <= finished + CLOCK_SLACK_MS;
  // The whole conversation in order, e.g. "stateChange:SERVICE_STATE_READY" or "shellOutput".
  const kinds = session.received.map((e) => {
    if (e.payload !== "event") return String(e.payload);
    const kind = e.event.eventType;
    return kind === "stateChange" ? `${kind}:${stateName(e.event.stateChange.state)}` : kind;
  });
  summary.received = {
    count: sequences.length,
    kinds,
    sequences,
    first_timestamp: timestamps[0] ?? null,
    last_timestamp: timestamps.at(-1) ?? null,
    timestamps_plausible: timestamps.every(plausible) && stateTimestamps.every(plausible),
    timestamps_monotonic: timestamps.every((t, i) => i === 0 || t >= timestamps[i - 1]),
  };
  summary.sent = {
    count: session.sent.length,
    sequences: session.sent.map((e) => num(e.sequence)),
  };
  expect(sequences.every((s, i) => s === i + 1), `received sequence numbers ${sequences.join(",")} are not 1, 2, 3, ...`);
  expect(summary.received.timestamps_plausible,
    `envelope timestamps outside [${started}, ${finished}] ± ${CLOCK_SLACK_MS} ms: ${timestamps.join(",")}`);
  expect(summary.received.timestamps_monotonic, `envelope timestamps go back: ${timestamps.join(",")}`);
}

const require = createRequire(import.meta.url);
const summary = {
  ok: false,
  client: {
    library: "protobufjs",
    library_version: require("protobufjs/package.json").version,
    node: process.version,
    started_ms: Date.now(),
  },
};
const sock = net.createConnection(socketPath);
const session = new Session(sock);
let status = 0;
try {
  await new Promise((resolve, reject) => { sock.once("connect", resolve); sock.once("error", reject); });
  await run(session, summary);
  checkEnvelopes(session, summary);
  summary.ok = true;
} catch (err) {
  status = 1;
  if (!summary.received) {
    try { checkEnvelopes(session, summary); } catch { /* the first surprise is the one to report */ }
  }
  summary.error = err instanceof Surprise ? err.message : String(err.stack ?? err);
  process.stderr.write(`v1_client: ${summary.error}\n`);
  sock.destroy();
}
process.stdout.write(JSON.stringify(summary) + "\n");
process.exitCode = status;
