/**
 * Where and as whom a party connects: servers, nats.js options, and the credentials of a
 * secured deployment (a `.creds` file, whose user name is the party's name and gives the
 * inbox prefix `_INBOX_<name>`, the only inbox that party may read).
 */

import { readFileSync } from "node:fs";
import { credsAuthenticator } from "nats";
import type { ConnectionOptions } from "nats";

import { ConnectError } from "./errors.js";
import type { ReachError } from "./errors.js";

/** Where to connect: a URL, a comma-separated list, a list of URLs, or nats.js connection options. */
export type Servers = string | string[] | ConnectionOptions;

export const DEFAULT_SERVER = "nats://127.0.0.1:4222";

// The schemes nats.js speaks from Node (TCP, plain or TLS); ws:// needs another transport.
const SCHEMES = new Set(["nats:", "tls:"]);

/** `$NATS_URL`, else the local default: set but empty counts as unset, as in the Python SDK. */
export function defaultServers(): string {
  return process.env.NATS_URL || DEFAULT_SERVER;
}

/**
 * `servers` checked and made a list: each a `nats://` or `tls://` URL (a bare `host:port`
 * taken as `nats://`) with a host and nothing after the port. Throws ConnectError naming the
 * first entry that is not one (`nats//host:4222` would otherwise be tried as the host
 * `nats`), as nothing is asked of a server that could help.
 */
export function serverList(servers: string | string[]): string[] {
  const typed = (typeof servers === "string" ? servers.split(",") : servers).map((s) => String(s).trim()).filter(Boolean);
  if (typed.length === 0) throw new ConnectError(`no NATS server URL given (${JSON.stringify(servers)}): expected nats://host:port`);
  for (const entry of typed) {
    const why = malformed(entry.includes("://") ? entry : `nats://${entry}`);
    if (why !== null) {
      throw new ConnectError(`'${redacted(entry)}' is not a NATS server URL: ${why} (expected nats://host:port; several are separated by commas)`);
    }
  }
  return typed;
}

/** Why `url` is no server URL nats.js can reach, or null. */
function malformed(url: string): string | null {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    return "it cannot be parsed";
  }
  if (!SCHEMES.has(parsed.protocol)) return `the scheme '${parsed.protocol.slice(0, -1)}' is not nats or tls`;
  if (parsed.hostname === "") return "it names no host";
  if (parsed.pathname !== "" && parsed.pathname !== "/") return `'${parsed.pathname}' follows the host and port`;
  return null;
}

/** `url` with a user's password or token hidden, for errors and logs. */
export function redacted(url: string): string {
  return url.replace(/\/\/[^/@]*@/, "//***@");
}

/** A party's connection: reconnecting for ever, with credentials when `creds` is a path. */
export function connectionOptions(
  servers: Servers,
  name: string,
  creds: CredsFile | null,
): ConnectionOptions {
  const base: ConnectionOptions =
    typeof servers === "string" || Array.isArray(servers)
      ? { servers: serverList(servers) }
      : { ...servers, ...(servers.servers === undefined ? {} : { servers: serverList(servers.servers) }) };
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
