/** Every subject, stream, bucket and consumer name an agent or a caller uses, for one prefix. */

import type { Priority } from "./types.js";

export const DEFAULT_PREFIX = "reach";
/** The sender token of what the coordinator publishes (no party may take it). */
export const COORDINATOR = "_coordinator";

const PREFIX = /^[A-Za-z0-9_-]{1,32}$/;

/** What is wrong with `prefix` as the prefix of every name, or null. */
export function prefixProblem(prefix: string): string | null {
  if (typeof prefix === "string" && PREFIX.test(prefix)) return null;
  return (
    `prefix ${JSON.stringify(prefix)} is not one name token: 1 to 32 letters, digits, '_' or '-'` +
    " (it begins every subject, stream and bucket name)"
  );
}

export class Names {
  constructor(readonly prefix: string = DEFAULT_PREFIX) {}

  /** Intake; an agent's sub-task names the agent as its sender: `reach.task.<topic>.<id>`. */
  task(topic: string, sender?: string): string {
    return sender ? `${this.prefix}.task.${topic}.${sender}` : `${this.prefix}.task.${topic}`;
  }

  /** A caller's reply box: replies arrive on `<box>.<sender>`. */
  replyBox(caller: string, box: string): string {
    return `${this.prefix}.reply.${caller}.${box}`;
  }

  /** Where a caller asks the coordinator for the recorded events of its own message. */
  traceRequest(caller: string): string {
    return `${this.prefix}.ctl.trace.${caller}`;
  }

  /** Every coordinator replica answers a request here. */
  get status(): string {
    return `${this.prefix}.ctl.status`;
  }

  dispatch(agentId: string, priority: Priority): string {
    return `${this.prefix}.agent.${agentId}.${priority.toLowerCase()}`;
  }

  /** `reach.event.<event>.<topic>.<trace_id>.<message_id>.<sender>`. */
  event(event: string, topic: string, traceId: string, messageId: string, sender: string): string {
    return `${this.prefix}.event.${event}.${topic}.${traceId}.${messageId}.${sender}`;
  }

  /**
   * Where a reply from `sender` goes: `<reply_to>.<sender>` for a caller's reply box
   * (`reach.reply.<caller>.<box>`) or a workflow (`reach.wf.reply.<instance>`), so the
   * sender is in the subject; `reply_to` itself for any other subject (an operator's inbox).
   */
  replySubject(replyTo: string, sender: string): string {
    const signed = replyTo.startsWith(`${this.prefix}.reply.`) || replyTo.startsWith(`${this.prefix}.wf.reply.`);
    return signed ? `${replyTo}.${sender}` : replyTo;
  }

  /**
   * Whether `subject` is a workflow's reply subject: its engine reads only a step's result,
   * and every reply sent there is stored, so acks and progress are not sent to it.
   */
  workflowReplies(subject: string): boolean {
    return subject.startsWith(`${this.prefix}.wf.reply.`);
  }

  /** Where a caller asks the coordinator to cancel a workflow instance it started. */
  workflowCancel(instanceId: string, caller: string): string {
    return `${this.prefix}.wf.cancel.${instanceId}.${caller}`;
  }

  workflowSignal(instanceId: string, event: string, caller: string): string {
    return `${this.prefix}.wf.signal.${instanceId}.${event}.${caller}`;
  }

  dlq(reason: string, topic: string): string {
    return `${this.prefix}.dlq.${reason}.${topic}`;
  }

  /**
   * Where the answers to `asker`'s probes go: the one place an agent may answer (it has no
   * response permission on a secured server). An inbox, for agents that answer only inboxes.
   */
  probeReplies(asker: string): string {
    return `_INBOX_probe.${asker}`;
  }

  presence(agentId: string): string {
    return `${this.prefix}.presence.${agentId}`;
  }

  ping(agentId: string): string {
    return `${this.prefix}.ping.${agentId}`;
  }

  agentControl(agentId: string): string {
    return `${this.prefix}.ctl.agent.${agentId}`;
  }

  /** An agent asks for its registration slot as itself. */
  register(agentId: string): string {
    return `${this.prefix}.ctl.register.${agentId}`;
  }

  get tasksStream(): string {
    return `${this.prefix.toUpperCase()}_TASKS`;
  }

  get eventsStream(): string {
    return `${this.prefix.toUpperCase()}_EVENTS`;
  }

  dispatchStream(priority: Priority): string {
    return `${this.prefix.toUpperCase()}_DISPATCH_${priority}`;
  }

  get agentsBucket(): string {
    return `${this.prefix}_agents`;
  }

  get heartbeatsBucket(): string {
    return `${this.prefix}_heartbeats`;
  }

  get executionsBucket(): string {
    return `${this.prefix}_executions`;
  }

  /** The Object Store bucket of claim-checked payloads and results. */
  get payloadsBucket(): string {
    return `${this.prefix}_payloads`;
  }

  agentConsumer(agentId: string, priority: Priority): string {
    return `agent-${agentId}-${priority.toLowerCase()}`;
  }
}
