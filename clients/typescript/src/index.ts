// jobq-client: a TypeScript client and worker for jobq.

export {
  checkQueues,
  Client,
  type ClientOptions,
  type CreateScheduleOptions,
  type EnqueueOptions,
  type EnqueueOutcomeName,
  type EnqueueSpec,
  type HeartbeatOptions,
  type LeaseRefLike,
  type ListJobsOptions,
  MAX_HEARTBEAT_LEASES,
  PROGRESS_MESSAGE_BYTES,
  type ProgressReport,
  type QueueCounts,
  type QueuePolicyLimits,
  type QueuePolicyView,
  type RateLimitSpec,
  type StatusLike,
} from "./client.js";
export { DEFAULT_SERVER, isLoopback, parseServer, type Endpoint, type Pem } from "./config.js";
export { JobContext } from "./context.js";
export {
  type CodeName,
  errorText,
  HandlerError,
  isTransient,
  JobFailedError,
  JobqError,
  WaitTimeoutError,
} from "./errors.js";
export { type AnyKinds, encodePayload, type KindMap } from "./payload.js";
export { date, millis } from "./time.js";
export { defaultWorkerId, type Handler, type Handlers, type Logger, Worker, type WorkerOptions } from "./worker.js";
export {
  AttemptOutcome,
  type Attempt,
  type EnqueueResult,
  type Job,
  JobQueue,
  JobStatus,
  type LeasedJob,
  type LeaseEvent,
  type Schedule,
} from "./gen/jobq/v1/jobq_pb.js";
