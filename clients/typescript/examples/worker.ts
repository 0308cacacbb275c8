// Sends confirmation emails: "sending" appends the order to $MAILBOX.
// SIGTERM or Ctrl-C drains: running jobs finish and are acked, then it exits.
import { appendFile, readFile } from "node:fs/promises";
import { Client, HandlerError, Worker } from "jobq-client";

type Kinds = { "send-email": { order: string; to: string } };
const mailbox = process.env["MAILBOX"] ?? "mailbox.txt";

const client = new Client<Kinds>();
const worker = new Worker(client, {
  queues: ["emails"],
  capacity: 4,
  handlers: {
    "send-email": async (ctx) => {
      const { order, to } = ctx.data;
      if (!to.includes("@")) throw HandlerError.fatal(`no address: ${to}`);
      // At least once: after a crash the job comes back, so look first.
      const sent = await readFile(mailbox, "utf8").catch(() => "");
      if (sent.split("\n").includes(order)) return console.log(`already sent ${order}`);
      await appendFile(mailbox, `${order}\n`); // real I/O takes ctx.signal
      console.log(`sent ${order} (attempt ${ctx.attempt})`);
    },
  },
});
await worker.run();
client.close();
