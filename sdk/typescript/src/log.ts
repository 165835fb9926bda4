/** A minimal structured logger: JSON lines on stderr, or whatever the user passes in. */

export type Fields = Record<string, unknown>;

export interface Logger {
  debug(event: string, fields?: Fields): void;
  info(event: string, fields?: Fields): void;
  warn(event: string, fields?: Fields): void;
  error(event: string, fields?: Fields): void;
}

export type LogLevel = "debug" | "info" | "warn" | "error" | "silent";
const ORDER: LogLevel[] = ["debug", "info", "warn", "error", "silent"];

// What JSON.stringify leaves raw that a terminal obeys: DEL, the C1 controls (U+009B acts as
// ESC [) and the bidi overrides. A handler's error quoting a caller's payload reached the
// operator's terminal so (a security re-test). Escaped, the line is the same JSON.
const OBEYED = /[\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;

/** `text` with each character a terminal would act on written as its JSON escape. */
export function shown(text: string): string {
  return text.replace(OBEYED, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);
}

/** JSON lines on stderr from `level` up, each with `base` (e.g. the agent_id) merged in. */
export function jsonLogger(level: LogLevel = "info", base: Fields = {}): Logger {
  const min = ORDER.indexOf(level);
  const line = (lvl: Exclude<LogLevel, "silent">) => (event: string, fields: Fields = {}) => {
    if (ORDER.indexOf(lvl) < min) return;
    const record = { ...base, ...fields, event, level: lvl, timestamp: new Date().toISOString() };
    process.stderr.write(`${shown(JSON.stringify(record))}\n`);
  };
  return { debug: line("debug"), info: line("info"), warn: line("warn"), error: line("error") };
}

/** Bind `fields` into every line of `log`. */
export function bound(log: Logger, fields: Fields): Logger {
  return {
    debug: (e, f) => log.debug(e, { ...fields, ...f }),
    info: (e, f) => log.info(e, { ...fields, ...f }),
    warn: (e, f) => log.warn(e, { ...fields, ...f }),
    error: (e, f) => log.error(e, { ...fields, ...f }),
  };
}
