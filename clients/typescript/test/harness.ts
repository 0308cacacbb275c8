// What the tests share: a real `jobq serve` on a free port with its own
// data folder, worker processes, and condition waits. A missing server
// binary fails loudly.

import { type ChildProcess, spawn } from "node:child_process";
import { closeSync, existsSync, mkdtempSync, openSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { AttemptOutcome, type Job } from "../src/index.js";

const HERE = dirname(fileURLToPath(import.meta.url));
/** The repository root (tests run from build/test/). */
export const ROOT = resolve(HERE, "..", "..", "..", "..");
export const JOBQ_BIN = process.env["JOBQ_BIN"] ?? join(ROOT, "target", "debug", "jobq");
export const FIXTURES = join(HERE, "fixtures");

export function tempDir(label: string): string {
  return mkdtempSync(join(tmpdir(), `jobq-ts-${label}-`));
}

/** Resolves once `cond` is truthy; rejects naming `what` after `timeoutMs`. */
export async function waitFor<T>(cond: () => T | Promise<T>, timeoutMs: number, what: string): Promise<NonNullable<T>> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await cond();
    if (v) return v as NonNullable<T>;
    if (Date.now() >= deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

export function lines(path: string): string[] {
  try {
    return readFileSync(path, "utf8").split("\n").filter((l) => l !== "");
  } catch {
    return [];
  }
}

export function outcomes(job: Job): string[] {
  return job.history.map((a) => AttemptOutcome[a.outcome] ?? String(a.outcome));
}

function exited(proc: ChildProcess): Promise<number | null> {
  if (proc.exitCode !== null || proc.signalCode !== null) return Promise.resolve(proc.exitCode);
  return new Promise((r) => proc.once("exit", (code) => r(code)));
}

/** `jobq serve` on 127.0.0.1 port 0 (or a given address), with `--data` in `dir`. */
export class Server {
  addr = "";
  url = "";
  logPath = "";
  private proc: ChildProcess | undefined;
  private starts = 0;
  private readonly data: string;

  private constructor(
    private readonly dir: string,
    private readonly extra: string[],
    private readonly name: string,
  ) {
    this.data = join(dir, `${name}-data`);
  }

  static async start(dir: string, extra: string[] = [], name = "server"): Promise<Server> {
    const s = new Server(dir, extra, name);
    await s.spawn("127.0.0.1:0");
    return s;
  }

  private async spawn(listen: string): Promise<void> {
    if (!existsSync(JOBQ_BIN)) throw new Error(`no server binary at ${JOBQ_BIN}: run \`cargo build -p jobq-cli\``);
    this.starts++;
    this.logPath = join(this.dir, `${this.name}-${this.starts}.log`);
    const log = openSync(this.logPath, "w");
    const args = ["serve", "--listen", listen, "--http-listen", "127.0.0.1:0", "--data", this.data, ...this.extra];
    const proc = spawn(JOBQ_BIN, args, { stdio: ["ignore", log, log] });
    closeSync(log);
    this.proc = proc;
    try {
      const m = await waitFor(
        () => {
          if (proc.exitCode !== null) throw new Error(`jobq serve exited ${proc.exitCode}`);
          return /jobq serving addr=(\S+)/.exec(readFileSync(this.logPath, "utf8"));
        },
        30_000,
        "jobq serve to listen",
      );
      this.addr = m[1] ?? "";
      this.url = `http://${this.addr}`;
    } catch (err) {
      proc.kill("SIGKILL");
      throw new Error(`jobq serve did not start (${String(err)}):\n${readFileSync(this.logPath, "utf8")}`);
    }
  }

  /** SIGKILL: no graceful anything. */
  async kill(): Promise<void> {
    const p = this.proc;
    if (p === undefined) return;
    p.kill("SIGKILL");
    await exited(p);
  }

  /** Starts again on the same address and data folder (after kill()); the port may take a moment to be free. */
  async restart(): Promise<void> {
    const deadline = Date.now() + 20_000;
    for (;;) {
      try {
        return await this.spawn(this.addr);
      } catch (err) {
        if (Date.now() > deadline) throw err;
        await new Promise((r) => setTimeout(r, 200));
      }
    }
  }

  async stop(): Promise<void> {
    const p = this.proc;
    if (p === undefined || p.exitCode !== null || p.signalCode !== null) return;
    p.kill("SIGTERM");
    const timer = setTimeout(() => p.kill("SIGKILL"), 10_000);
    await exited(p);
    clearTimeout(timer);
  }

  log(): string {
    return readFileSync(this.logPath, "utf8");
  }
}

/** A worker process (test/fixtures/email-worker), its output collected. */
export class WorkerProcess {
  readonly proc: ChildProcess;
  private out = "";

  constructor(args: string[], env: NodeJS.ProcessEnv = process.env) {
    this.proc = spawn(process.execPath, [join(FIXTURES, "email-worker.js"), ...args], {
      stdio: ["ignore", "pipe", "pipe"],
      env,
    });
    this.proc.stdout?.on("data", (b: Buffer) => (this.out += b.toString()));
    this.proc.stderr?.on("data", (b: Buffer) => (this.out += b.toString()));
  }

  get output(): string {
    return this.out;
  }

  async expectLine(text: string, timeoutMs = 20_000): Promise<void> {
    await waitFor(() => this.out.split("\n").includes(text), timeoutMs, `the worker to print ${JSON.stringify(text)}:\n${this.out}`);
  }

  /** Resolves to the exit code, or rejects after `timeoutMs`. */
  async exit(timeoutMs: number): Promise<number | null> {
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`the worker did not exit within ${timeoutMs} ms:\n${this.out}`)), timeoutMs);
    });
    try {
      return await Promise.race([exited(this.proc), timeout]);
    } finally {
      clearTimeout(timer);
    }
  }

  async kill(): Promise<void> {
    if (this.proc.exitCode === null && this.proc.signalCode === null) {
      this.proc.kill("SIGKILL");
      await exited(this.proc);
    }
  }
}

export function removeDir(dir: string): void {
  rmSync(dir, { recursive: true, force: true });
}
