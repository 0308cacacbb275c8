// The worker's book of in-flight leases (the Rust client's inflight.rs):
// what the heartbeat extends, and whose handler to cancel when a lease is
// lost. Pure bookkeeping, no I/O.

import type { JobContext } from "./context.js";
import type { LeaseRefLike } from "./client.js";

interface Entry {
  ctx: JobContext;
  /** Its ack or fail has been sent: that call's answer, not a heartbeat or revoke that crossed it, decides. */
  settling: boolean;
}

/** In-flight jobs by id, from the lease's arrival until its ack/fail is settled or the lease is found lost. */
export class Book {
  private readonly jobs = new Map<string, Entry>();

  get size(): number {
    return this.jobs.size;
  }

  /** Books a lease; returns the same job's older run, whose lease is necessarily lost. */
  insert(ctx: JobContext): JobContext | undefined {
    const old = this.jobs.get(ctx.id);
    this.jobs.set(ctx.id, { ctx, settling: false });
    return old?.ctx;
  }

  settling(ctx: JobContext): void {
    const e = this.jobs.get(ctx.id);
    if (e !== undefined && e.ctx.leaseId === ctx.leaseId) e.settling = true;
  }

  /** Marks the lease settling for a give-back, unless its ack or fail is on its way (or it left the book): true when claimed. */
  claim(ctx: JobContext): boolean {
    const e = this.jobs.get(ctx.id);
    if (e === undefined || e.ctx.leaseId !== ctx.leaseId || e.settling) return false;
    e.settling = true;
    return true;
  }

  /** Forgets the job, but only under the lease it ran with. */
  remove(ctx: JobContext): boolean {
    if (!this.holds(ctx)) return false;
    this.jobs.delete(ctx.id);
    return true;
  }

  holds(ctx: JobContext): boolean {
    return this.jobs.get(ctx.id)?.ctx.leaseId === ctx.leaseId;
  }

  /** Every lease, with the progress its handler reported since the last heartbeat that carried one, sorted by job id. */
  snapshot(): LeaseRefLike[] {
    return [...this.jobs.entries()]
      .map(([jobId, e]) => {
        const progress = e.ctx.report();
        return progress === undefined ? { jobId, leaseId: e.ctx.leaseId } : { jobId, leaseId: e.ctx.leaseId, progress };
      })
      .sort((a, b) => (a.jobId < b.jobId ? -1 : a.jobId > b.jobId ? 1 : 0));
  }

  contexts(): JobContext[] {
    return [...this.jobs.values()].map((e) => e.ctx);
  }

  /**
   * Lost leases leave the book and are returned for cancelling (settling
   * ones stay: their ack's answer decides); the other sent leases still
   * held get the new deadline.
   */
  applyHeartbeat(sent: readonly LeaseRefLike[], lost: readonly LeaseRefLike[], newDeadline: number): JobContext[] {
    const out: JobContext[] = [];
    const lostKeys = new Set(lost.map((r) => `${r.jobId}\u0000${r.leaseId}`));
    for (const r of lost) {
      const ctx = this.take(r.jobId, r.leaseId);
      if (ctx !== undefined) out.push(ctx);
    }
    for (const r of sent) {
      if (lostKeys.has(`${r.jobId}\u0000${r.leaseId}`)) continue;
      const e = this.jobs.get(r.jobId);
      if (e !== undefined && e.ctx.leaseId === r.leaseId) e.ctx.extendTo(newDeadline);
    }
    return out;
  }

  /** The reports `sent` carried were taken: forgotten, unless their handlers reported again. */
  reported(sent: readonly LeaseRefLike[]): void {
    for (const r of sent) {
      const e = this.jobs.get(r.jobId);
      if (r.progress !== undefined && e !== undefined && e.ctx.leaseId === r.leaseId) e.ctx.reported(r.progress);
    }
  }

  /** A `revoked` event: the lease leaves the book if held (and not settling). */
  revoke(jobId: string, leaseId: string): JobContext | undefined {
    return this.take(jobId, leaseId);
  }

  /** Takes out the leases whose deadline passed (no heartbeat got through): the server may have given those jobs to someone else. */
  expired(now: number): JobContext[] {
    const out: JobContext[] = [];
    for (const [id, e] of this.jobs) {
      if (!e.settling && e.ctx.leaseDeadline() <= now) {
        this.jobs.delete(id);
        out.push(e.ctx);
      }
    }
    return out;
  }

  private take(jobId: string, leaseId: string): JobContext | undefined {
    const e = this.jobs.get(jobId);
    if (e === undefined || e.ctx.leaseId !== leaseId || e.settling) return undefined;
    this.jobs.delete(jobId);
    return e.ctx;
  }
}
