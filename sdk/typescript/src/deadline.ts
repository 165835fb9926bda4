/**
 * How long a handler may run: its intent's deadline, restarted by each progress report,
 * and never past the task's execute budget (the sender's limit, counted from the start).
 */

import { performance } from "node:perf_hooks";

export const LEASE_GRACE_MS = 1_000; // time to record the outcome after the deadline

export class Deadline {
  readonly started = performance.now();
  readonly windowMs: number;
  private endsAt: number;
  private timer: NodeJS.Timeout | undefined;
  private onPass: (() => void) | null = null;
  private held = 0; // progress reports under way (see hold)

  constructor(
    readonly budgetMs: number,
    windowMs: number | null,
  ) {
    this.windowMs = Math.min(windowMs ?? budgetMs, budgetMs);
    this.endsAt = this.started + this.windowMs;
  }

  /** The deadline in ms after the start (progress may move it later). */
  get totalMs(): number {
    return Math.round(this.endsAt - this.started);
  }

  leftMs(): number {
    return Math.max(0, Math.round(this.endsAt - performance.now()));
  }

  /** A claim must last this long from now to outlive the deadline and the recording. */
  leaseMs(): number {
    return this.leftMs() + LEASE_GRACE_MS;
  }

  /** Call `onPass` when the deadline passes (following it when progress moves it). */
  enforce(onPass: () => void): void {
    this.onPass = onPass;
    this.arm();
  }

  /** Progress: the window starts again, within the budget. True when it moved. */
  extend(): boolean {
    const endsAt = Math.min(performance.now() + this.windowMs, this.started + this.budgetMs);
    if (endsAt <= this.endsAt) return false;
    this.endsAt = endsAt;
    if (this.onPass !== null && this.held === 0) this.arm();
    return true;
  }

  /**
   * Until the returned function is called (a progress report and its claim renewal are
   * made), the deadline does not pass, only the budget's end: the handler waits on the
   * report, not on its own work, and a server slow to take it (away for a moment) must not
   * cost it its deadline, nor run its work again. The window starts again at each end.
   */
  hold(): () => void {
    this.extend();
    this.held += 1;
    this.arm(this.started + this.budgetMs);
    return () => {
      this.held -= 1;
      this.extend();
      if (this.held === 0) this.arm();
    };
  }

  clear(): void {
    clearTimeout(this.timer);
    this.onPass = null;
  }

  private arm(at: number = this.endsAt): void {
    clearTimeout(this.timer);
    const onPass = this.onPass;
    if (onPass !== null) this.timer = setTimeout(onPass, Math.max(0, at - performance.now()));
  }
}
