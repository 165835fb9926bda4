/** Waiting: plain sleeps for pacing (never for synchronisation), and jitter. */

export const JITTER = 0.2;

/** `ms` ± 20 %, so a fleet started together does not beat in step. */
export function jittered(ms: number): number {
  return ms * (1 + (Math.random() * 2 - 1) * JITTER);
}

/** Resolve after `ms`, or at once when `signal` is aborted. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const timer = setTimeout(done, ms);
    function done(): void {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    }
    signal?.addEventListener("abort", done, { once: true });
  });
}

/** A promise with its resolver, for "wait until this happens". */
export class Signal {
  private resolveFn!: () => void;
  private promise = this.fresh();
  private fired = false;

  private fresh(): Promise<void> {
    return new Promise((resolve) => {
      this.resolveFn = resolve;
    });
  }

  get isSet(): boolean {
    return this.fired;
  }

  set(): void {
    this.fired = true;
    this.resolveFn();
  }

  clear(): void {
    if (this.fired) {
      this.fired = false;
      this.promise = this.fresh();
    }
  }

  wait(): Promise<void> {
    return this.promise;
  }
}
