// Enqueues order 4711's confirmation email. $JOBQ_SERVER (default
// http://127.0.0.1:50051), $JOBQ_TOKEN and $JOBQ_CA_CERT configure it.
import { Client, JobqError } from "jobq-client";

type Kinds = { "send-email": { order: string; to: string } };

const client = new Client<Kinds>();
try {
  const { job, created } = await client.enqueue(
    "emails",
    "send-email",
    { order: "order-4711", to: "ada@example.com" },
    { key: "order-4711" }, // one job per order, however often this runs
  );
  console.log(`job ${job.id} ${created ? "created" : "already there"}`);
} catch (err) {
  if (!(err instanceof JobqError)) throw err;
  console.error(`enqueue refused: ${err.code}: ${err.serverMessage}`);
  process.exitCode = 1;
} finally {
  client.close();
}
