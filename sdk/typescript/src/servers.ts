/**
 * Where and as whom a party connects: servers, nats.js options, and the credentials of a
 * secured deployment (a `.creds` file, whose user name is the party's name and gives the
 * inbox prefix `_INBOX_<name>`, the only inbox that party may read).
 */

import { readFileSync } from "node:fs";
import { credsAuthenticator } from "nats";
import type { ConnectionOptions } from "nats";

import type { ReachError } from "./errors.js";

/** Where to connect: a URL, a comma-separated list, a list of URLs, or nats.js connection options. */
export type Servers = string | string[] | ConnectionOptions;

export const DEFAULT_SERVER = "nats://127.0.0.1:4222";

/** `$NATS_URL`, else the local default. */
export function defaultServers(): string {
  return process.env.NATS_URL ?? DEFAULT_SERVER;
}

/** A party's connection: reconnecting for ever, with credentials when `creds` is a path. */
export function connectionOptions(
  servers: Servers,
  name: string,
  creds: CredsFile | null,
): ConnectionOptions {
  const base: ConnectionOptions =
    typeof servers === "string" || Array.isArray(servers)
      ? { servers: typeof servers === "string" ? servers.split(",").map((s) => s.trim()) : servers }
      : servers;
  // A tls:// URL asks for TLS: nats.js upgrades only when the server requires it, and went on
  // in plain text, creds and all, with a server (or a man in the middle) that offers none.
  const tls = base.tls === undefined && asksForTls(base.servers) ? { tls: {} } : {};
  return {
    name,
    timeout: 2_000,
    maxReconnectAttempts: -1, // a service rides out server restarts
    reconnectTimeWait: 500,
    pingInterval: 10_000,
    maxPingOut: 3,
    ...(creds === null ? {} : { authenticator: creds.authenticator }),
    ...(creds?.user ? { inboxPrefix: `_INBOX_${creds.user}` } : {}),
    ...tls,
    ...base,
  };
}

function asksForTls(servers: ConnectionOptions["servers"]): boolean {
  const listed = typeof servers === "string" ? [servers] : (servers ?? []);
  return listed.some((server) => server.trim().toLowerCase().startsWith("tls://"));
}

/** A `.creds` file read once: its authenticator and the `name` of its user (null if none). */
export interface CredsFile {
  path: string;
  user: string | null;
  authenticator: NonNullable<ConnectionOptions["authenticator"]>;
}

/** Read `path`; `wrong` makes the error thrown when it cannot be read. */
export function readCreds(path: string, wrong: (message: string) => ReachError): CredsFile {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (err) {
    throw wrong(`cannot read creds file ${path}: ${(err as Error).message}`);
  }
  return { path, user: userNameOf(text), authenticator: credsAuthenticator(new TextEncoder().encode(text)) };
}

/** The `name` claim of the user JWT in a creds file (read, not verified: the server does). */
function userNameOf(creds: string): string | null {
  const jwt = /-----BEGIN NATS USER JWT-----\s*([A-Za-z0-9_.=-]+)\s*------END NATS USER JWT------/.exec(creds)?.[1];
  const payload = jwt?.split(".")[1];
  if (!payload) return null;
  try {
    const claims = JSON.parse(Buffer.from(payload, "base64url").toString("utf8")) as { name?: unknown };
    return typeof claims.name === "string" ? claims.name : null;
  } catch {
    return null;
  }
}
