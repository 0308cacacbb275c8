// Where the client connects and with what credentials: the server URL
// ($JOBQ_SERVER), the bearer token ($JOBQ_TOKEN), the CA ($JOBQ_CA_CERT),
// and the rule that a token never travels in clear to another machine
// unless the caller says so. The same rules as the Rust and Python clients.

import { readFileSync } from "node:fs";
import { BlockList, isIP } from "node:net";

import { JobqError } from "./errors.js";

/** The server the CLI talks to by default. */
export const DEFAULT_SERVER = "http://127.0.0.1:50051";

/** Where and how to connect, resolved from options and the environment. */
export interface Endpoint {
  /** `http://host:port` or `https://host:port`, always with a port. */
  baseUrl: string;
  /** The host as written in the URL (IPv6 in brackets). */
  host: string;
  tls: boolean;
}

/**
 * Parses a server URL as the CLI takes it: `http://host:port`,
 * `https://host:port`, or a bare `host:port` (plaintext). Undefined reads
 * $JOBQ_SERVER, then http://127.0.0.1:50051. Without a port, the scheme's:
 * 80 for http (and a bare host), 443 for https.
 */
export function parseServer(server: string | undefined, env: NodeJS.ProcessEnv = process.env): Endpoint {
  const url = (server ?? (env["JOBQ_SERVER"] || DEFAULT_SERVER)).trim();
  let rest: string;
  let tls = false;
  if (url.startsWith("https://")) {
    rest = url.slice("https://".length);
    tls = true;
  } else if (url.startsWith("http://")) {
    rest = url.slice("http://".length);
  } else if (url.includes("://")) {
    throw JobqError.config(`jobq server ${JSON.stringify(url)}: the scheme must be http:// or https://`);
  } else {
    rest = url;
  }
  rest = rest.replace(/\/+$/, "");
  if (!rest || rest.includes("/")) {
    throw JobqError.config(
      `jobq server ${JSON.stringify(url)}: expected http://host:port or https://host:port`,
    );
  }
  // `[::1]:50051` has a port; `[::1]` and `host` do not.
  const hasPort = rest.startsWith("[") ? rest.includes("]:") : rest.includes(":");
  if (!hasPort) rest += tls ? ":443" : ":80";
  const host = rest.startsWith("[") ? rest.slice(0, rest.indexOf("]") + 1) : rest.slice(0, rest.lastIndexOf(":"));
  const port = rest.slice(host.length + 1);
  if (!host || !/^\d{1,5}$/.test(port) || Number(port) > 65535) {
    throw JobqError.config(`jobq server ${JSON.stringify(url)}: expected http://host:port or https://host:port`);
  }
  return { baseUrl: `${tls ? "https" : "http"}://${rest}`, host, tls };
}

const LOOPBACK = new BlockList();
LOOPBACK.addSubnet("127.0.0.0", 8, "ipv4");
LOOPBACK.addAddress("::1", "ipv6");
LOOPBACK.addSubnet("::ffff:127.0.0.0", 104, "ipv6");

/**
 * `localhost` or a loopback address (127.0.0.0/8, ::1, ::ffff:127.x.y.z).
 * Any other name is not, even one that resolves to a loopback address: what
 * it resolves to can change.
 */
export function isLoopback(host: string): boolean {
  let h = host;
  if (h.startsWith("[") && h.endsWith("]")) h = h.slice(1, -1);
  if (h.toLowerCase() === "localhost") return true;
  const kind = isIP(h);
  if (kind === 4) return LOOPBACK.check(h, "ipv4");
  if (kind === 6) return LOOPBACK.check(h, "ipv6");
  return false;
}

/** The token from the option, else $JOBQ_TOKEN; blank is none. */
export function resolveToken(token: string | undefined, env: NodeJS.ProcessEnv = process.env): string | undefined {
  const t = (token ?? env["JOBQ_TOKEN"] ?? "").trim();
  return t === "" ? undefined : t;
}

/**
 * Refuses, before any connection exists, a token that would travel in clear
 * to another machine: plaintext, not this machine, and no `insecure: true`.
 */
export function checkPlaintextToken(endpoint: Endpoint, token: string | undefined, insecure: boolean): void {
  if (token === undefined || insecure || endpoint.tls || isLoopback(endpoint.host)) return;
  throw JobqError.config(
    `refusing to send the token in clear to ${endpoint.host}: the connection is plaintext and ` +
      `${endpoint.host} is not this machine; use https://, or pass insecure: true`,
  );
}

/** PEM bytes: given as text or bytes, or read from a path. */
export type Pem = string | Uint8Array | { path: string };

function readPem(pem: Pem): Buffer {
  if (typeof pem === "string") return Buffer.from(pem);
  if (pem instanceof Uint8Array) return Buffer.from(pem);
  return readFileSync(pem.path);
}

export interface TlsFiles {
  ca?: Buffer;
  cert?: Buffer;
  key?: Buffer;
}

/**
 * TLS material for an https:// endpoint: `caCert`, else $JOBQ_CA_CERT (a PEM
 * path), else the system's roots; `clientCert` and `clientKey` for mTLS. Any
 * of them with a plaintext URL is refused rather than ignored.
 */
export function tlsFiles(
  endpoint: Endpoint,
  opts: { caCert?: Pem; clientCert?: Pem; clientKey?: Pem },
  env: NodeJS.ProcessEnv = process.env,
): TlsFiles {
  const asked = opts.caCert !== undefined || opts.clientCert !== undefined || opts.clientKey !== undefined;
  if (!endpoint.tls) {
    if (asked) {
      throw JobqError.config(
        `a CA or a client certificate was given, but ${endpoint.baseUrl} is not an https:// URL`,
      );
    }
    return {};
  }
  if ((opts.clientCert === undefined) !== (opts.clientKey === undefined)) {
    throw JobqError.config("clientCert and clientKey go together (mTLS needs both)");
  }
  const out: TlsFiles = {};
  const caPath = env["JOBQ_CA_CERT"];
  if (opts.caCert !== undefined) out.ca = readPem(opts.caCert);
  else if (caPath) out.ca = readPem({ path: caPath });
  if (opts.clientCert !== undefined) out.cert = readPem(opts.clientCert);
  if (opts.clientKey !== undefined) out.key = readPem(opts.clientKey);
  return out;
}
