/** `ReachClient`: send tasks to agents and wait for their results, from any Node.js program. */

import { setMaxListeners } from "node:events";

import { ErrorCode } from "nats";
import type { NatsError, Subscription } from "nats";

import { budgetOf, taskOf } from "./arguments.js";
import { ClaimCheck, DEFAULT_CLAIM_CHECK_BYTES } from "./claimcheck.js";
import { encode, MAX_MS, newId, nowMs, taskHeaders, TOKEN } from "./codec.js";
import { Connection, ELECTION_BUDGET_MS } from "./connection.js";
import { coordinatorRuns, NO_COORDINATOR, PublishWarnings } from "./coordinatorstatus.js";
import { Traces } from "./endings.js";
import { BacklogFull, InvalidArgument, NotAcknowledged, ReachError } from "./errors.js";
import { aborted, earlierOutcome, Ending, waitForResult } from "./invocation.js";
import { lookedUp } from "./lookup.js";
import type { ResultOptions, StatusOptions } from "./lookup.js";
import { notStored, refusedPublish } from "./refusals.js";
import type { OnAck, OnProgress, Outcome } from "./invocation.js";
import { jsonLogger } from "./log.js";
import type { Logger } from "./log.js";
import { Names, prefixProblem } from "./names.js";
import { ReplyBox } from "./replybox.js";
import { headersOf, sentByServer } from "./serveranswers.js";
import { connectionOptions, defaultServers, readCreds } from "./servers.js";
import type { Servers } from "./servers.js";
import { Signal, sleep } from "./timing.js";
import { CANCEL_WORKFLOW_OPTIONS, CLIENT_OPTIONS, INVOKE_OPTIONS, INVOKE_TASK_OPTIONS, onlyKnown, RESULT_OPTIONS } from "./options.js";
import { SIGNAL_WORKFLOW_OPTIONS, STATUS_OPTIONS, TASK_OPTIONS } from "./options.js";
import { normalized } from "./tracecontext.js";
import type { Budget, Event, Priority, Task } from "./types.js";
import { cancelWorkflow, signalWorkflow } from "./workflowcontrol.js";
import type { CancelWorkflowOptions, SignalOutcome, SignalWorkflowOptions, WorkflowEnded } from "./workflowcontrol.js";


export interface ReachClientOptions {
  /**
   * Who this client is on an open server: the last token of its subjects (default
   * `client`). With creds, the name of their user wins (the server enforces it).
   */
  name?: string;
  /** A `.creds` file (a secured deployment); default `$NATS_CREDS`. */
  creds?: string;
  /** Subject prefix (default `reach`): the coordinator's. */
  prefix?: string;
  /** Where log lines go (default JSON lines on stderr from info up). */
  logger?: Logger;
  /** Timeout of each request to the server or the coordinator (default 5 000). */
  requestTimeoutMs?: number;
  /** Payloads (and results) whose JSON is larger than this go through the Object Store (262 144). */
  claimCheckBytes?: number;
}

/** What a task carries besides its topic and payload. */
export interface TaskOptions {
  /** `P0` (most urgent), `P1` (default), `P2`. */
  priority?: Priority;
  /** How long the task may wait to start (default 30 000; invoke: both deadlines together). */
  ttlMs?: number;
  /** The business chain's id (default: the message id). */
  traceId?: string;
  /** The request's id (default: a new UUIDv7). Send a request again under the same id. */
  messageId?: string;
  /** Where acknowledgements and the result go (publish only; invoke uses a reply box of its own). */
  replyTo?: string | null;
  /** The timeout budget in ms (publish only; invoke takes its two deadlines). */
  budget?: Partial<Budget>;
  /** Free string pairs that routing rules may match (`header.<Name>`). */
  headers?: Record<string, string>;
  /** W3C trace context joining the caller's trace; an invalid one is ignored, as W3C asks. */
  traceparent?: string | null;
}

export type PublishOptions = TaskOptions;
export type InvokeTaskOptions = Pick<InvokeOptions, "onAck" | "onProgress" | "signal">;

export interface InvokeOptions extends Omit<TaskOptions, "replyTo" | "budget"> {
  /** How long to wait for an agent to accept the task (default 2 000). */
  ackDeadlineMs?: number;
  /**
   * How long the handler (each workflow step) may run, and how long to wait for the result
   * after the ack, at least until the task's ttl runs out (default 30 000).
   */
  executeDeadlineMs?: number;
  /** Called for every acknowledgement (a retry is acknowledged again). */
  onAck?: OnAck;
  /** Called for every progress note. */
  onProgress?: OnProgress;
  /** Stop waiting (InvokeAborted); the task itself goes on. */
  signal?: AbortSignal;
}

/** A published task: its ids, and whether the stream held its message id already. */
export interface Published {
  messageId: string;
  traceId: string;
  /** Sent before (within the duplicate window): this one was not taken in again. */
  duplicate: boolean;
}

/**
 * A connection for sending work to agents.
 *
 *     const client = await ReachClient.connect("nats://127.0.0.1:4222");
 *     const result = await client.invoke("summarize", { text: "..." });
 *     const { messageId } = await client.publish("summarize", { text: "..." });
 *     await client.close();
 */
export class ReachClient {
  private readonly claimCheck: ClaimCheck;
  private readonly traces: Traces;
  private readonly warnings: PublishWarnings;
  private readonly waiting = new Set<ReplyBox>();
  private readonly closed = new Signal();
  private ownsConnection = true;

  private constructor(
    private readonly conn: Connection,
    /** Who this client is: the name in its creds, else the `name` given. */
    readonly caller: string,
    private readonly log: Logger,
    claimCheckBytes: number,
  ) {
    this.claimCheck = new ClaimCheck(conn.js, conn.names.payloadsBucket, claimCheckBytes);
    this.traces = new Traces(conn, caller);
    this.warnings = new PublishWarnings(conn, log);
  }

  /**
   * A client over a connection of the caller's own (an agent's, for its sub-tasks): closing
   * it leaves the connection open.
   * @internal
   */
  static over(conn: Connection, caller: string, log: Logger): ReachClient {
    const client = new ReachClient(conn, caller, log, DEFAULT_CLAIM_CHECK_BYTES);
    client.ownsConnection = false;
    return client;
  }

  /**
   * Connect: `servers` is a URL, a comma-separated list, an array, or nats.js
   * `ConnectionOptions` (default `$NATS_URL`, then `nats://127.0.0.1:4222`). A server that
   * is not there, or refuses the credentials, is an error at once.
   */
  static async connect(servers: Servers = defaultServers(), options: ReachClientOptions = {}): Promise<ReachClient> {
    onlyKnown("ReachClient.connect()", options, CLIENT_OPTIONS, invalidOptions);
    const requestTimeoutMs = positive("requestTimeoutMs", options.requestTimeoutMs ?? 5_000);
    const claimCheckBytes = positive("claimCheckBytes", options.claimCheckBytes ?? DEFAULT_CLAIM_CHECK_BYTES);
    const path = options.creds ?? process.env.NATS_CREDS ?? null;
    const creds = path === null ? null : readCreds(path, (m) => new InvalidArgument(m, "creds"));
    const caller = creds?.user ?? options.name ?? "client";
    if (!TOKEN.test(caller)) {
      const argument = creds?.user ? "creds" : "name";
      throw new InvalidArgument(`${argument}: the caller's name '${caller}' must be 1-128 letters, digits, '_' or '-'`, argument);
    }
    const prefixSaid = options.prefix === undefined ? null : prefixProblem(options.prefix);
    if (prefixSaid !== null) throw new InvalidArgument(prefixSaid, "prefix");
    const names = new Names(options.prefix);
    const conn = await Connection.connect(connectionOptions(servers, `client:${caller}`, creds), names, requestTimeoutMs);
    return new ReachClient(conn, caller, options.logger ?? jsonLogger("info"), claimCheckBytes);
  }

  /**
   * A task envelope, validated as the coordinator will validate it. Throws InvalidArgument
   * naming a wrong argument, or a payload that has no JSON form.
   */
  task(topic: string, payload: unknown, options: TaskOptions = {}): Task {
    onlyKnown(`task '${topic}'`, options, TASK_OPTIONS, invalidOptions);
    const messageId = options.messageId ?? newId();
    const traceparent = options.traceparent ? normalized(options.traceparent) : null;
    return taskOf({
      v: 1,
      kind: "task",
      message_id: messageId,
      trace_id: options.traceId ?? messageId,
      topic,
      payload: payload ?? null,
      priority: options.priority ?? "P1",
      reply_to: options.replyTo ?? null,
      created_at: nowMs(),
      ttl_ms: options.ttlMs,
      budget: options.budget,
      headers: options.headers,
      traceparent,
    });
  }

  /**
   * Publish a built task to `<prefix>.task.<topic>.<caller>` (a large payload is
   * claim-checked). While the intake holds as many of this caller's tasks on the topic as it
   * keeps, it waits for room (backpressure), up to the task's ttl; while JetStream does not
   * answer, for up to `electionsMs` (15 s by default), then NotStored. False when the stream
   * held its message id already (sent within the duplicate window): it is not taken in again.
   */
  async submit(task: Task, electionsMs?: number): Promise<boolean> {
    this.mustBeOpen();
    const stowed = await this.claimCheck.stowTask(task);
    const subject = this.conn.names.task(stowed.topic, this.caller);
    const giveUpAt = performance.now() + stowed.ttl_ms;
    for (let pauseMs = ROOM_PAUSE_FIRST_MS; ; pauseMs = Math.min(pauseMs * 2, ROOM_PAUSE_CAP_MS)) {
      try {
        const ack = await this.conn.publish(subject, encode(stowed), taskHeaders(stowed), electionsMs);
        return !ack.duplicate;
      } catch (err) {
        const refused = refusedPublish(err, stowed, subject, this.caller);
        if (!(refused instanceof BacklogFull) || performance.now() + pauseMs > giveUpAt) throw refused ?? notStored(err, stowed);
      }
      await sleep(pauseMs); // room comes as the coordinator takes the backlog
    }
  }

  /**
   * Fire and forget: the task is stored in the task stream before this resolves. When no
   * coordinator runs it waits there until one starts (within its ttl), and a warning is
   * logged: the check runs in the background, at most once a minute.
   */
  async publish(topic: string, payload: unknown, options: PublishOptions = {}): Promise<Published> {
    const task = this.task(topic, payload, options);
    const taken = await this.submit(task);
    this.warnings.published(topic, task.message_id);
    return { messageId: task.message_id, traceId: task.trace_id, duplicate: !taken };
  }

  /**
   * Send a task and wait for its result.
   *
   * Throws InvalidArgument before sending when an argument is wrong; NotAcknowledged if no
   * agent accepts the task within `ackDeadlineMs` (saying so when no coordinator runs);
   * DeadlineExceeded if, once accepted, no outcome comes within `executeDeadlineMs` nor
   * before the task's ttl runs out (and the coordinator's verdict of it);
   * Rejected when the task is refused before any agent took it (nothing ran: safe to send
   * again); TaskFailed when it fails after an agent took it; InvokeAborted when `signal`
   * is aborted.
   *
   * After NotAcknowledged, DeadlineExceeded or InvokeAborted the task is still queued or
   * running. To retry safely, invoke again with the error's `messageId`: the new call
   * attaches to the first message and answers with how it ends, and the task runs once.
   */
  async invoke<R = unknown>(topic: string, payload: unknown, options: InvokeOptions = {}): Promise<R> {
    this.mustBeOpen();
    onlyKnown(`invoke '${topic}'`, options, INVOKE_OPTIONS, invalidOptions);
    const { ackDeadlineMs, executeDeadlineMs, onAck, onProgress, signal, ...taskOptions } = options;
    const budget = budgetOf(ackDeadlineMs ?? 2_000, executeDeadlineMs ?? 30_000);
    const ttlMs = options.ttlMs ?? Math.min(budget.ack_ms + budget.execute_ms, MAX_MS);
    const task = this.task(topic, payload, { ...taskOptions, ttlMs, budget });
    return await this.invokeTask<R>(task, { onAck, onProgress, signal });
  }

  /**
   * `invoke` of a task built already (`client.task()`, `ctx.childTask()`): its deadlines are
   * its budget's `ack_ms` and `execute_ms`; its replies come to a reply box of this call's (its
   * `reply_to` is replaced).
   */
  async invokeTask<R = unknown>(built: Task, options: InvokeTaskOptions = {}): Promise<R> {
    this.mustBeOpen();
    onlyKnown(`invokeTask '${built.topic}'`, options, INVOKE_TASK_OPTIONS, invalidOptions);
    const boxSubject = this.conn.names.replyBox(this.caller, newId());
    const task = { ...built, reply_to: boxSubject };
    if (options.signal?.aborted) throw aborted(task, options.signal, false);
    // One signal shared by many calls (a handler's ctx.signal, AbortSignal.timeout) holds a
    // listener per waiting call: not a leak, so Node's warning past 10 is not wanted.
    if (options.signal !== undefined) setMaxListeners(0, options.signal);
    // Made before the box is subscribed: a reconnect from then on may lose a reply.
    const ending = new Ending(this.conn, this.traces, task.message_id);
    const box = new ReplyBox(boxSubject, task.message_id, this.log);
    // Subscribed before the task is published: the routed notice can come within a millisecond.
    const sub: Subscription = this.conn.nc.subscribe(box.wildcard, {
      callback: (err, msg) => {
        if (err === null && sentByServer(msg.data, headersOf(msg), { headed: true }) === null) box.collect(msg.subject, msg.data);
      },
    });
    this.waiting.add(box);
    try {
      let outcome: Outcome;
      // As long for JetStream to store it as for an agent to accept it (a lost majority).
      if (await this.submit(task, Math.max(ELECTION_BUDGET_MS, task.budget.ack_ms))) {
        try {
          outcome = await waitForResult(task, box, ending, { ...options, log: this.log });
        } catch (err) {
          throw err instanceof NotAcknowledged ? await this.unacknowledged(err, task, ending) : err;
        }
      } else {
        outcome = await earlierOutcome(this.traces, task, options.signal, this.closed); // nobody answers this box
      }
      return (await this.claimCheck.resultOf(...outcome)) as R;
    } finally {
      this.waiting.delete(box);
      sub.unsubscribe();
    }
  }

  /**
   * The recorded lifecycle events of `messageId` (or, when no message of this caller has
   * that id, of its trace of that id), oldest first, as the coordinator answers a caller:
   * only this caller's own messages.
   */
  async status(messageId: string, options: StatusOptions = {}): Promise<Event[]> {
    this.mustBeOpen();
    onlyKnown("status()", options, STATUS_OPTIONS, invalidOptions);
    try {
      return (await this.traces.ask(messageId, options.timeoutMs)).events;
    } catch (err) {
      if (err instanceof ReachError) throw err;
      const why =
        (err as NatsError).code === ErrorCode.NoResponders
          ? "no coordinator is running (start one: reach up / reach coordinator); a caller reads its messages' events through it"
          : String(err);
      throw new ReachError(`cannot read the events of '${messageId}': ${why}`, { cause: err });
    }
  }

  /**
   * The result of a message this caller sent earlier (`publish`, an invoke that gave up), once
   * it ends, waiting up to `timeoutMs` (30 000): nothing is sent, its events are read. Throws
   * as `invoke` does for how it ended (TaskFailed, Rejected…); DeadlineExceeded when it has not
   * ended by then (ask again) or no event of it is recorded; InvalidArgument for another
   * caller's message; NotAcknowledged when no coordinator runs.
   */
  async result<R = unknown>(messageId: string, options: ResultOptions = {}): Promise<R> {
    this.mustBeOpen();
    onlyKnown("result()", options, RESULT_OPTIONS, invalidOptions);
    const withinMs = positive("timeoutMs", options.timeoutMs ?? 30_000);
    const outcome = await lookedUp(this.traces, messageId, withinMs, options.signal, this.closed);
    return (await this.claimCheck.resultOf(...outcome)) as R;
  }

  /**
   * Cancel a workflow instance this caller started (its id: the starting task's `messageId`)
   * and wait up to `waitMs` (10 000) for it to end: `status` `cancelled`, or how it ended
   * otherwise first (`beforeCancel`: it had ended before; nothing was sent). `why` is added
   * to its error's message. Throws UnknownWorkflow for an id that is no instance of this
   * caller's, DeadlineExceeded when it has not ended within `waitMs` (the cancel was sent).
   */
  async cancelWorkflow(instanceId: string, options: CancelWorkflowOptions = {}): Promise<WorkflowEnded> {
    this.mustBeOpen();
    onlyKnown("cancelWorkflow()", options, CANCEL_WORKFLOW_OPTIONS, invalidOptions);
    const eventsOf = (id: string) => this.status(id);
    return await cancelWorkflow(this.conn, this.caller, eventsOf, instanceId, options.why ?? "", options.waitMs ?? 10_000);
  }

  /**
   * Signal `event` to a state machine instance this caller started and wait up to `waitMs`
   * (10 000) for whether its state took it (SignalOutcome). Throws UnknownWorkflow for an id
   * that is no instance of this caller's, DeadlineExceeded when the coordinator has not said.
   */
  async signalWorkflow(instanceId: string, event: string, options: SignalWorkflowOptions = {}): Promise<SignalOutcome> {
    this.mustBeOpen();
    onlyKnown("signalWorkflow()", options, SIGNAL_WORKFLOW_OPTIONS, invalidOptions);
    const eventsOf = (id: string) => this.status(id);
    return await signalWorkflow(this.conn, this.caller, eventsOf, instanceId, event, options.waitMs ?? 10_000);
  }

  /** Pending invokes end now (InvokeError), then the connection closes. Safe to call twice. */
  async close(): Promise<void> {
    if (this.closed.isSet) return;
    this.closed.set();
    this.warnings.close();
    for (const box of this.waiting) box.close();
    if (this.ownsConnection) await this.conn.close();
  }

  private mustBeOpen(): void {
    if (this.closed.isSet) throw new ReachError("the ReachClient is closed; connect a new one");
  }

  /**
   * `err`, saying where the task waits, or that no coordinator runs: then nothing routes it,
   * and waiting longer for an agent cannot help. Asked only now, on the failure path.
   */
  private async unacknowledged(err: NotAcknowledged, task: Task, ending: Ending): Promise<NotAcknowledged> {
    // Said with no coordinator too: the task waits in the intake, and runs once one starts.
    const hint =
      nowMs() >= task.created_at + task.ttl_ms
        ? `its ttl (${task.ttl_ms} ms) has passed, so no agent will start it: invoke again with messageId '${err.messageId}' to hear how it ended`
        : `it stays queued and may still run within its ttl: invoke again with messageId '${err.messageId}' to hear how it ends`;
    const runs = await coordinatorRuns(this.conn);
    const why = ending.whyUnacknowledged(runs === true);
    if (runs !== false) return new NotAcknowledged(`${err.message}: ${why}; ${hint}`, err);
    return new NotAcknowledged(`${err.message}: ${NO_COORDINATOR}; ${hint}`, err);
  }

}

function positive(name: string, value: number): number {
  if (typeof value !== "number") throw new InvalidArgument(`${name} must be a number, got ${JSON.stringify(value)}`, name);
  if (!(value > 0)) throw new InvalidArgument(`${name} must be positive, got ${value}`, name);
  return value;
}

function invalidOptions(message: string): InvalidArgument {
  return new InvalidArgument(message, "options");
}

// While the intake holds a caller's whole backlog on a topic, its next publish is tried again
// after these pauses (doubling), until its task's ttl.
const ROOM_PAUSE_FIRST_MS = 50;
const ROOM_PAUSE_CAP_MS = 1_000;

