// Enqueue awa_pool jobs from Node.js: the schema is the contract (SPEC §12).
//
//   cd examples/node_producer && npm ci
//   DATABASE_URL=postgresql://... node producer.js 42 a@example.com
//
// One transaction: the app's own writes and the jobs commit together, and
// supervisors are woken (NOTIFY) at the commit. Each row of
// INSERT INTO awa.jobs gets awa.insert_job's defaults, validation, lane and
// unique key; a bad row (priority 7, args that are not an object...) fails
// the whole statement with one error naming the column, and inserts
// nothing. RETURNING id gives the jobs' ids, in the order of the rows.
// The jobs are run by `cd examples && awa-pool start --app receipts`.
"use strict";

const { Client } = require("pg");

async function main() {
  const [orderId, email] = [Number(process.argv[2] || 42), process.argv[3] || "a@example.com"];
  const client = new Client({ connectionString: process.env.DATABASE_URL });
  await client.connect();
  try {
    await client.query("BEGIN");
    // one job now, and a reminder in an hour in a queue of its own
    const { rows } = await client.query(
      `INSERT INTO awa.jobs (kind, args, queue, priority, run_at, tags)
       VALUES ('send_receipt', $1, 'default', 2, NULL, '{node}'),
              ('send_receipt', $2, 'reminders', 3, now() + interval '1 hour', '{node,reminder}')
       RETURNING id`,
      [JSON.stringify({ order_id: orderId, email }), JSON.stringify({ order_id: orderId, email })]);
    // at most one "receipt sent" audit job per order, however often this runs
    // (unique_opts as awa.insert_job takes them; RETURNING gives the existing job's id)
    const unique = await client.query(
      `INSERT INTO awa.jobs (kind, args, queue, unique_opts)
       VALUES ('send_receipt', $1, 'audit', '{"by_args": true}') RETURNING id`,
      [JSON.stringify({ order_id: orderId, email: "audit@example.com" })]);
    await client.query("COMMIT");
    console.log(JSON.stringify({ ids: rows.map((row) => Number(row.id)), audit: Number(unique.rows[0].id) }));
  } catch (error) {
    await client.query("ROLLBACK");
    throw error;
  } finally {
    await client.end();
  }
}

main().catch((error) => {
  console.error(`error: ${error.message}`);
  process.exit(1);
});
