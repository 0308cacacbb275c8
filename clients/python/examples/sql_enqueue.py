"""Enqueue from inside your own transaction (PostgreSQL store, psycopg 3):
the order and its confirmation email commit together, or neither does.

    DATABASE_URL=postgresql://app@db/shop python sql_enqueue.py [order-4711]

The role connecting needs EXECUTE on jobq_enqueue (GRANT jobq_producer TO
app) and whatever your own tables need.
"""
import json
import os
import sys

import psycopg


def place_order(conn: psycopg.Connection, order: str) -> int:
    """Records the order and asks for its confirmation email, in one
    transaction; returns the job's id."""
    email = {"order": order, "to": "ada@example.com"}
    with conn.transaction():
        conn.execute("INSERT INTO orders (id) VALUES (%s)", (order,))
        row = conn.execute(
            "SELECT jobq_enqueue(queue => 'emails', kind => 'send-email',"
            " payload => %s, key => %s, max_attempts => 5)",
            (json.dumps(email).encode(), order),
        ).fetchone()
    assert row is not None
    return int(row[0])


if __name__ == "__main__":
    order = sys.argv[1] if len(sys.argv) > 1 else "order-4711"
    with psycopg.connect(os.environ["DATABASE_URL"]) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY)")
        conn.commit()
        print(f"order {order}: job {place_order(conn, order)}")
