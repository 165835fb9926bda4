/**
 * Says when the event loop stood still: a blocked loop writes no heartbeat and answers no
 * presence check, so the coordinator calls the agent SUSPECT, and nothing in the agent's own
 * log said why (the Python SDK's watchdog does; a trial). JavaScript has no second thread to
 * see it while it lasts, so it is said once the loop turns again, with how long it stood.
 */
import type { Logger } from "./log.js";

/** Ticks every `thresholdMs / 4`; a tick later than `thresholdMs` is logged. Returns the stop. */
export function watchLag(log: Logger, thresholdMs: number): () => void {
  const tickMs = Math.max(10, thresholdMs / 4);
  let last = performance.now();
  const timer = setInterval(() => {
    const now = performance.now();
    const lagMs = now - last - tickMs;
    last = now;
    if (lagMs > thresholdMs) {
      // A stopped process (SIGSTOP, a paused VM) looks the same from here.
      log.warn("heartbeat lag detected: the event loop was blocked, or the process stopped", {
        lag_s: Math.round(lagMs) / 1000,
      });
    }
  }, tickMs);
  timer.unref(); // never what keeps the process alive
  return () => clearInterval(timer);
}
