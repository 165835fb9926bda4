/** Every subject, stream, bucket and consumer name an agent uses, for one prefix. */

import type { Priority } from "./types.js";

export const DEFAULT_PREFIX = "reach";

export class Names {
  constructor(readonly prefix: string = DEFAULT_PREFIX) {}

  task(topic: string): string {
    return `${this.prefix}.task.${topic}`;
  }

  dispatch(agentId: string, priority: Priority): string {
    return `${this.prefix}.agent.${agentId}.${priority.toLowerCase()}`;
  }

  event(event: string, topic: string, traceId: string, messageId: string): string {
    return `${this.prefix}.event.${event}.${topic}.${traceId}.${messageId}`;
  }

  dlq(reason: string, topic: string): string {
    return `${this.prefix}.dlq.${reason}.${topic}`;
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

  get register(): string {
    return `${this.prefix}.ctl.register`;
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

  agentConsumer(agentId: string, priority: Priority): string {
    return `agent-${agentId}-${priority.toLowerCase()}`;
  }
}
