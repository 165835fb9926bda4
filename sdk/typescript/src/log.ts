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

/** JSON lines on stderr from `level` up, each with `base` (e.g. the agent_id) merged in. */
export function jsonLogger(level: LogLevel = "info", base: Fields = {}): Logger {
  const min = ORDER.indexOf(level);
  const line = (lvl: Exclude<LogLevel, "silent">) => (event: string, fields: Fields = {}) => {
    if (ORDER.indexOf(lvl) < min) return;
    const record = { ...base, ...fields, event, level: lvl, timestamp: new Date().toISOString() };
    process.stderr.write(`${JSON.stringify(record)}\n`);
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
