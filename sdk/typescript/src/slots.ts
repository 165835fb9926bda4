/**
 * Room in an agent. A handler's `capacity` is how many of its tasks run at once, whatever
 * their priority (its places, shared by the three priorities); each priority has a pool of
 * as many slots as all handlers have places, one per delivery it holds, so that a full P2
 * pool never keeps P0 from being fetched (protocol §6). The handler latency an agent
 * advertises with its free slots.
 */

import { setMaxListeners } from "node:events";

import type { Priority, Task } from "./types.js";

/** How many deliveries of one priority the agent holds, and a way to wait for room. */
export class WorkerPool {
  busy = 0;
  private waiters: Array<() => void> = [];

  constructor(readonly size: number) {}

  get free(): number {
    return this.size - this.busy;
  }

  async waitFree(signal: AbortSignal): Promise<void> {
    while (this.free <= 0 && !signal.aborted) {
      await new Promise<void>((resolve) => {
        const done = () => {
          signal.removeEventListener("abort", done);
          resolve();
        };
        this.waiters.push(done);
        signal.addEventListener("abort", done, { once: true });
      });
    }
  }

  take(): void {
    this.busy += 1;
  }

  give(): void {
    this.busy -= 1;
    const waiters = this.waiters;
    this.waiters = [];
    for (const wake of waiters) wake();
  }
}

interface Waiting {
  priority: Priority;
  wake: () => void;
}

/**
 * The `size` places of one handler, shared by the three priorities. A place that frees
 * passes straight to the most urgent task waiting for one (P0 before P1 before P2, in
 * order of arrival within a priority): a running task is never cut short, but an urgent
 * one is next.
 */
export class HandlerPlaces {
  busy = 0;
  private readonly queue: Waiting[] = []; // most urgent first

  constructor(readonly size: number) {}

  get free(): number {
    return this.size - this.busy;
  }

  get waiting(): number {
    return this.queue.length;
  }

  /**
   * Take a place, waiting for one if need be: true once taken, false when `signal` aborted
   * first. With two places or more, P1 and P2 never take the last free one, so a P1/P2
   * backlog cannot hold every place while P0 waits.
   */
  take(priority: Priority, signal: AbortSignal): Promise<boolean> {
    if (signal.aborted) return Promise.resolve(false);
    if (this.queue.length === 0 && this.free > this.keptForP0(priority)) {
      this.busy += 1;
      return Promise.resolve(true);
    }
    return new Promise<boolean>((resolve) => {
      const entry: Waiting = {
        priority,
        wake: () => {
          signal.removeEventListener("abort", abandon);
          resolve(true);
        },
      };
      const abandon = () => {
        const at = this.queue.indexOf(entry);
        if (at >= 0) this.queue.splice(at, 1);
        resolve(false);
      };
      const after = this.queue.findIndex((w) => w.priority > priority); // "P0" < "P1" < "P2"
      this.queue.splice(after < 0 ? this.queue.length : after, 0, entry);
      signal.addEventListener("abort", abandon, { once: true });
      this.handOut();
    });
  }

  /** Give a place back: to the next task waiting that may take it, else free. */
  give(): void {
    this.busy -= 1;
    this.handOut();
  }

  /** Places a task of `priority` could take now (P1/P2 not the one kept for P0). */
  freeTo(priority: Priority): number {
    return Math.max(0, this.free - this.keptForP0(priority));
  }

  private keptForP0(priority: Priority): number {
    return this.size > 1 && priority !== "P0" ? 1 : 0;
  }

  /** Free places to the most urgent waiting tasks, as far as each may take one. */
  private handOut(): void {
    for (let next = this.queue[0]; next !== undefined; next = this.queue[0]) {
      if (this.free <= this.keptForP0(next.priority)) return; // those behind are no more urgent
      this.queue.shift();
      this.busy += 1;
      next.wake();
    }
  }
}

/** How a task's wait for its handler's place ended. */
export type Entry = "entered" | "stopping" | "expired";

/**
 * Where tasks run: a place of their handler, taken when a task is accepted and given back
 * when its handler ends, and the pools of deliveries per priority.
 */
export class Room {
  readonly pools: Record<Priority, WorkerPool>;
  private readonly places = new Map<string, HandlerPlaces>();

  constructor(
    capacities: Map<string, number>,
    private readonly stopping: AbortSignal,
  ) {
    for (const [topic, size] of capacities) this.places.set(topic, new HandlerPlaces(size));
    // A listener per task waiting for a place: past 10 not a leak, so Node's warning (a trial's
    // capacity-20 agent printed it under load) is not wanted.
    setMaxListeners(0, stopping);
    let total = 0;
    for (const size of capacities.values()) total += size;
    this.pools = { P0: new WorkerPool(total), P1: new WorkerPool(total), P2: new WorkerPool(total) };
  }

  /** Tasks running now (all priorities). */
  get running(): number {
    let n = 0;
    for (const place of this.places.values()) n += place.busy;
    return n;
  }

  /** Tasks that could start now, were they of the right topics: the handlers' free places. */
  get free(): number {
    let n = 0;
    for (const place of this.places.values()) n += place.free;
    return n;
  }

  /** More tasks of `task`'s topic and priority that could start now. */
  freeFor(task: Task): number {
    // A place kept for P0 is no room for the caller's next P1 task: the ack says so.
    return Math.max(0, Math.min(this.place(task.topic).freeTo(task.priority), this.pools[task.priority].free));
  }

  /**
   * Take a place of the task's handler, waiting for one for up to `withinMs` (what is left
   * of its ttl); `keepAlive` is called when it must wait, and what it returns when the wait
   * ends (a place frees when a handler ends, which may take longer than the ack wait: the
   * delivery must be kept meanwhile). `stopping` when the agent began to stop first (a
   * stopping agent starts nothing new), `expired` when the wait outlasted the ttl: both
   * without a place.
   */
  async enter(task: Task, keepAlive: () => () => void, withinMs: number): Promise<Entry> {
    const place = this.place(task.topic);
    if (this.stopping.aborted) return "stopping";
    if (place.free > 0 && place.waiting === 0 && (await place.take(task.priority, this.stopping))) {
      return "entered";
    }
    const stopKeeping = keepAlive();
    const waiting = new AbortController();
    const stop = () => waiting.abort();
    this.stopping.addEventListener("abort", stop, { once: true });
    const timer = setTimeout(stop, Math.max(0, withinMs));
    try {
      const took = await place.take(task.priority, waiting.signal);
      if (took && waiting.signal.aborted) place.give(); // handed over as the wait ended
      if (took && !waiting.signal.aborted) return "entered";
      return this.stopping.aborted ? "stopping" : "expired";
    } finally {
      clearTimeout(timer);
      this.stopping.removeEventListener("abort", stop);
      stopKeeping();
    }
  }

  leave(task: Task): void {
    this.place(task.topic).give();
  }

  /** Give the place back once `running` settles: a handler past its deadline that ignores its
   * abort signal runs on, and `capacity` held no more (a trial saw 4 runs at capacity 1). */
  leaveAfter(task: Task, running: Promise<unknown> | undefined): void {
    if (running === undefined) return this.leave(task);
    void running.then(() => this.leave(task), () => this.leave(task));
  }

  /** A handler registered after the start (not on the card either) gets one place. */
  private place(topic: string): HandlerPlaces {
    let place = this.places.get(topic);
    if (place === undefined) this.places.set(topic, (place = new HandlerPlaces(1)));
    return place;
  }
}

/** A moving average of handler latency. */
export class LatencyEstimate {
  private average: number | null = null;

  constructor(private readonly weight = 0.2) {}

  get estimateMs(): number {
    return Math.floor(this.average ?? 0);
  }

  observe(durationMs: number): void {
    this.average = this.average === null ? durationMs : this.average + this.weight * (durationMs - this.average);
  }
}

/**
 * The moving averages of handler latency an agent advertises: one per topic, for the
 * capacity of an `ack` (a caller of a 5 ms topic is not told the average of the 5 s one
 * beside it), and one of every run, for the load of a heartbeat.
 */
export class Latencies {
  private readonly all: LatencyEstimate;
  private readonly byTopic = new Map<string, LatencyEstimate>();

  constructor(private readonly weight = 0.2) {
    this.all = new LatencyEstimate(weight);
  }

  /** Of every run, whatever its topic; 0 before the first. */
  get estimateMs(): number {
    return this.all.estimateMs;
  }

  /** Of the runs of `topic`'s handler; 0 before its first. */
  of(topic: string): number {
    return this.byTopic.get(topic)?.estimateMs ?? 0;
  }

  observe(topic: string, durationMs: number): void {
    this.all.observe(durationMs);
    let estimate = this.byTopic.get(topic);
    if (estimate === undefined) this.byTopic.set(topic, (estimate = new LatencyEstimate(this.weight)));
    estimate.observe(durationMs);
  }
}
