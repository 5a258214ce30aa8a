"""A commit of everything held locks the job's usage log, not its user's balance row.

Revisions 0029 and 0033 had every commit lock the user's balance row first. A commit without an
amount (everything held: a completion, the default settlement) releases nothing, so it writes
neither the balance nor a lot: only the log and its COMMIT row. Holding the balance row made it
queue behind every other transaction of the user that holds that row until it commits (the
user's submits, their settlements), a wait of at least one WAL flush each. It now locks the log
(``FOR UPDATE OF l``). Every writer of what it reads locks the log too, after the balance: the
refund (its compare-and-set) and a legacy refund's import (its re-read, locked from this
version on), so the lock order stays the balance, then the log. A commit for an amount (which
may release) still locks the balance row first.

``FUNCTIONS`` is the whole set as the code builds it at this revision (reserve and refund are
unchanged), frozen: the newest revision declaring ``FUNCTIONS`` is the one the table contract
compares the database with. ``CREATE OR REPLACE FUNCTION`` locks no table (deploy-safe); the
downgrade puts revision 0033's functions back.

Revision ID: 0034
Revises: 0033
"""

from reconcile.db.migrate import create_functions, set_lock_timeout

revision = "0034"
down_revision = "0033"
branch_labels = None
depends_on = None

# name → (arguments, body)
FUNCTIONS = {
    "reconcile_ledger_reserve": (
        "p_u uuid, p_j uuid, p_amount bigint, p_usage_id text, p_now timestamptz, p_log_id uuid, OUT r_bal_sub bigint, OUT r_bal_topup bigint, OUT r_sub bigint, OUT r_topup bigint, OUT r_inserted bigint, OUT r_lots bigint[], OUT r_log_id text, OUT r_replay boolean",
        """
DECLARE
  v_written bigint;
BEGIN
SELECT sub, topup FROM reconcile_credit_balances WHERE user_id = p_u FOR UPDATE
  INTO r_bal_sub, r_bal_topup;
r_bal_sub := COALESCE(r_bal_sub, 0);
r_bal_topup := COALESCE(r_bal_topup, 0);
IF r_bal_sub + r_bal_topup < p_amount THEN  -- too little: nothing written (a replay?)
SELECT EXISTS (SELECT FROM reconcile_credit_transactions WHERE id = p_usage_id)
  INTO r_replay;
  RETURN;
END IF;
IF p_log_id IS NULL THEN  -- the database assigns usage_logs.id
WITH RECURSIVE walk(p, id, rem, cum) AS (
  SELECT * FROM (
    (SELECT 0 AS p, l.id, l.remaining_amount AS rem, l.remaining_amount AS cum FROM reconcile_credit_lots l
     WHERE l.user_id = p_u AND l.pool = 'sub' AND l.remaining_amount > 0 ORDER BY l.id LIMIT 1)
    UNION ALL
    (SELECT 1 AS p, l.id, l.remaining_amount AS rem, l.remaining_amount AS cum FROM reconcile_credit_lots l
     WHERE l.user_id = p_u AND l.pool = 'topup' AND l.remaining_amount > 0 ORDER BY l.id LIMIT 1)
    ORDER BY p LIMIT 1) AS first_lot
  UNION ALL
  SELECT n.p, n.id, n.rem, w.cum + n.rem FROM walk w CROSS JOIN LATERAL (
    (SELECT 0 AS p, l.id, l.remaining_amount AS rem FROM reconcile_credit_lots l
     WHERE w.p = 0 AND l.user_id = p_u AND l.pool = 'sub' AND l.remaining_amount > 0
       AND l.id > w.id ORDER BY l.id LIMIT 1)
    UNION ALL
    (SELECT 1 AS p, l.id, l.remaining_amount AS rem FROM reconcile_credit_lots l
     WHERE l.user_id = p_u AND l.pool = 'topup' AND l.remaining_amount > 0
       AND l.id > (CASE WHEN w.p = 1 THEN w.id ELSE 0 END) ORDER BY l.id LIMIT 1)
    ORDER BY p LIMIT 1) n
  WHERE w.cum < p_amount::bigint
),
take AS (SELECT p, id, LEAST(rem, p_amount::bigint - (cum - rem)) AS t FROM walk),
tot AS (SELECT COALESCE(SUM(t) FILTER (WHERE p = 0), 0)::bigint AS s,
               COALESCE(SUM(t) FILTER (WHERE p = 1), 0)::bigint AS tp FROM take),
ins AS (
  INSERT INTO reconcile_credit_transactions (id, user_id, job_id, type, amount, from_sub, from_topup, created_at)
  SELECT p_usage_id, p_u, p_j, 'USAGE', p_amount::bigint, s, tp, p_now FROM tot
  WHERE s + tp = p_amount::bigint
  ON CONFLICT (id) DO NOTHING RETURNING from_sub, from_topup),
lots AS (
  UPDATE reconcile_credit_lots l SET remaining_amount = l.remaining_amount - take.t FROM take, ins
  WHERE l.id = take.id AND l.id = ANY (ARRAY(SELECT id FROM take)) RETURNING l.id),
bal AS (
  UPDATE reconcile_credit_balances b SET sub = b.sub - ins.from_sub, topup = b.topup - ins.from_topup,
         updated_at = p_now FROM ins WHERE b.user_id = p_u RETURNING 1),
log AS (
  INSERT INTO usage_logs (job_id, user_id, status, credits, metadata, created_at)
  SELECT p_j, p_u, 'reserved', p_amount::bigint,
         jsonb_build_object('from_sub', from_sub, 'from_topup', from_topup), p_now FROM ins
  RETURNING id)
SELECT tot.s, tot.tp, (SELECT count(*) FROM ins), (SELECT array_agg(id) FROM lots),
       (SELECT count(*) FROM bal) + (SELECT count(*) FROM log), (SELECT id FROM log) FROM tot
  INTO r_sub, r_topup, r_inserted, r_lots, v_written, r_log_id;
ELSE
WITH RECURSIVE walk(p, id, rem, cum) AS (
  SELECT * FROM (
    (SELECT 0 AS p, l.id, l.remaining_amount AS rem, l.remaining_amount AS cum FROM reconcile_credit_lots l
     WHERE l.user_id = p_u AND l.pool = 'sub' AND l.remaining_amount > 0 ORDER BY l.id LIMIT 1)
    UNION ALL
    (SELECT 1 AS p, l.id, l.remaining_amount AS rem, l.remaining_amount AS cum FROM reconcile_credit_lots l
     WHERE l.user_id = p_u AND l.pool = 'topup' AND l.remaining_amount > 0 ORDER BY l.id LIMIT 1)
    ORDER BY p LIMIT 1) AS first_lot
  UNION ALL
  SELECT n.p, n.id, n.rem, w.cum + n.rem FROM walk w CROSS JOIN LATERAL (
    (SELECT 0 AS p, l.id, l.remaining_amount AS rem FROM reconcile_credit_lots l
     WHERE w.p = 0 AND l.user_id = p_u AND l.pool = 'sub' AND l.remaining_amount > 0
       AND l.id > w.id ORDER BY l.id LIMIT 1)
    UNION ALL
    (SELECT 1 AS p, l.id, l.remaining_amount AS rem FROM reconcile_credit_lots l
     WHERE l.user_id = p_u AND l.pool = 'topup' AND l.remaining_amount > 0
       AND l.id > (CASE WHEN w.p = 1 THEN w.id ELSE 0 END) ORDER BY l.id LIMIT 1)
    ORDER BY p LIMIT 1) n
  WHERE w.cum < p_amount::bigint
),
take AS (SELECT p, id, LEAST(rem, p_amount::bigint - (cum - rem)) AS t FROM walk),
tot AS (SELECT COALESCE(SUM(t) FILTER (WHERE p = 0), 0)::bigint AS s,
               COALESCE(SUM(t) FILTER (WHERE p = 1), 0)::bigint AS tp FROM take),
ins AS (
  INSERT INTO reconcile_credit_transactions (id, user_id, job_id, type, amount, from_sub, from_topup, created_at)
  SELECT p_usage_id, p_u, p_j, 'USAGE', p_amount::bigint, s, tp, p_now FROM tot
  WHERE s + tp = p_amount::bigint
  ON CONFLICT (id) DO NOTHING RETURNING from_sub, from_topup),
lots AS (
  UPDATE reconcile_credit_lots l SET remaining_amount = l.remaining_amount - take.t FROM take, ins
  WHERE l.id = take.id AND l.id = ANY (ARRAY(SELECT id FROM take)) RETURNING l.id),
bal AS (
  UPDATE reconcile_credit_balances b SET sub = b.sub - ins.from_sub, topup = b.topup - ins.from_topup,
         updated_at = p_now FROM ins WHERE b.user_id = p_u RETURNING 1),
log AS (
  INSERT INTO usage_logs (id, job_id, user_id, status, credits, metadata, created_at)
  SELECT p_log_id, p_j, p_u, 'reserved', p_amount::bigint,
         jsonb_build_object('from_sub', from_sub, 'from_topup', from_topup), p_now FROM ins
  RETURNING id)
SELECT tot.s, tot.tp, (SELECT count(*) FROM ins), (SELECT array_agg(id) FROM lots),
       (SELECT count(*) FROM bal) + (SELECT count(*) FROM log), (SELECT id FROM log) FROM tot
  INTO r_sub, r_topup, r_inserted, r_lots, v_written, r_log_id;
END IF;
IF r_inserted = 0 THEN  -- nothing written: a replay, or lots short of the balance
SELECT EXISTS (SELECT FROM reconcile_credit_transactions WHERE id = p_usage_id)
  INTO r_replay;
END IF;
END;
"""),
    "reconcile_ledger_commit": (
        "p_j uuid, p_now timestamptz, p_usage_id text, p_refund_id text, p_amount bigint, p_commit_id text, p_release_id text, p_release_sub text, p_release_topup text, p_rec_status text, p_rec_share text, OUT r_log_id text, OUT r_user_id uuid, OUT r_credits bigint, OUT r_meta jsonb, OUT r_reserved boolean, OUT r_has_usage bigint, OUT r_held bigint, OUT r_committed bigint, OUT r_status text",
        """
DECLARE
  v_log record;
BEGIN
IF p_amount IS NULL THEN
SELECT l.id, l.user_id, l.credits, l.metadata FROM usage_logs l
JOIN reconcile_credit_balances b ON b.user_id = l.user_id
WHERE l.job_id = p_j AND l.status = 'reserved' ORDER BY l.created_at LIMIT 1 FOR UPDATE OF l
  INTO v_log;
ELSE
SELECT l.id, l.user_id, l.credits, l.metadata FROM usage_logs l
JOIN reconcile_credit_balances b ON b.user_id = l.user_id
WHERE l.job_id = p_j AND l.status = 'reserved' ORDER BY l.created_at LIMIT 1 FOR UPDATE OF b
  INTO v_log;
END IF;
IF NOT FOUND THEN  -- no reserved log with its user's balance row
SELECT EXISTS (SELECT FROM usage_logs WHERE job_id = p_j AND status = 'reserved')
  INTO r_reserved;
  RETURN;
END IF;
r_log_id := v_log.id::text;
r_user_id := v_log.user_id;
r_credits := v_log.credits;
r_meta := v_log.metadata;
IF p_rec_status IS NULL THEN
WITH t AS (
  SELECT MAX(from_sub) FILTER (WHERE id = p_usage_id) AS us,
         MAX(from_topup) FILTER (WHERE id = p_usage_id) AS ut,
         COALESCE(SUM(from_sub) FILTER (WHERE type = 'REFUND' AND id <> p_refund_id), 0) AS ls,
         COALESCE(SUM(from_topup) FILTER (WHERE type = 'REFUND' AND id <> p_refund_id), 0) AS lt,
         COALESCE(BOOL_OR(id = p_refund_id), false) AS refunded
  FROM reconcile_credit_transactions WHERE job_id = p_j),
h AS (
  SELECT GREATEST(0, us - ls)::bigint AS hs, GREATEST(0, ut - lt)::bigint AS ht, refunded
  FROM t WHERE us IS NOT NULL),
c AS (SELECT hs, ht, COALESCE(p_amount::bigint, hs + ht) AS amt FROM h),
p AS (SELECT hs, ht, amt, LEAST(amt, hs) AS cs, amt - LEAST(amt, hs) AS ct FROM c
      WHERE amt BETWEEN 0 AND hs + ht),
cas AS (
  UPDATE usage_logs u SET status = 'committed',
    metadata = CASE WHEN jsonb_typeof(u.metadata::jsonb) IS DISTINCT FROM 'object' THEN u.metadata::jsonb WHEN u.metadata::jsonb ? 'settlement' THEN u.metadata::jsonb - 'settlement' ELSE u.metadata::jsonb END FROM p
  WHERE u.id = v_log.id AND u.status = 'reserved'
  RETURNING p.cs, p.ct, p.hs - p.cs AS rs, p.ht - p.ct AS rt),
ci AS (
  INSERT INTO reconcile_credit_transactions (id, user_id, job_id, type, amount, from_sub, from_topup, created_at)
  SELECT p_commit_id, r_user_id, p_j, 'COMMIT', cs + ct, cs, ct, p_now FROM cas RETURNING 1),
ri AS (
  INSERT INTO reconcile_credit_transactions (id, user_id, job_id, type, amount, from_sub, from_topup, created_at)
  SELECT p_release_id, r_user_id, p_j, 'RELEASE', rs + rt, rs, rt, p_now FROM cas
  WHERE rs + rt > 0 RETURNING 1),
lo AS (
  INSERT INTO reconcile_credit_lots (user_id, pool, kind, source_txn_id, amount, remaining_amount, created_at)
  SELECT r_user_id, v.pool, 'RELEASE', v.src, v.n, v.n, p_now
  FROM cas CROSS JOIN LATERAL (VALUES (1, 'sub', p_release_sub, cas.rs),
                                      (2, 'topup', p_release_topup, cas.rt)) AS v(o, pool, src, n)
  WHERE v.n > 0 ORDER BY v.o RETURNING 1),
bal AS (
  UPDATE reconcile_credit_balances b SET sub = b.sub + cas.rs, topup = b.topup + cas.rt, updated_at = p_now
  FROM cas WHERE b.user_id = r_user_id AND cas.rs + cas.rt > 0 RETURNING 1)
SELECT (SELECT count(*) FROM h), (SELECT hs + ht FROM h), (SELECT cs + ct FROM cas),
       (SELECT status FROM usage_logs WHERE id = v_log.id)
  INTO r_has_usage, r_held, r_committed, r_status;
ELSE
WITH t AS (
  SELECT MAX(from_sub) FILTER (WHERE id = p_usage_id) AS us,
         MAX(from_topup) FILTER (WHERE id = p_usage_id) AS ut,
         COALESCE(SUM(from_sub) FILTER (WHERE type = 'REFUND' AND id <> p_refund_id), 0) AS ls,
         COALESCE(SUM(from_topup) FILTER (WHERE type = 'REFUND' AND id <> p_refund_id), 0) AS lt,
         COALESCE(BOOL_OR(id = p_refund_id), false) AS refunded
  FROM reconcile_credit_transactions WHERE job_id = p_j),
h AS (
  SELECT GREATEST(0, us - ls)::bigint AS hs, GREATEST(0, ut - lt)::bigint AS ht, refunded
  FROM t WHERE us IS NOT NULL),
c AS (SELECT hs, ht, COALESCE(p_amount::bigint, hs + ht) AS amt FROM h),
p AS (SELECT hs, ht, amt, LEAST(amt, hs) AS cs, amt - LEAST(amt, hs) AS ct FROM c
      WHERE amt BETWEEN 0 AND hs + ht),
cas AS (
  UPDATE usage_logs u SET status = 'committed',
    metadata = CASE WHEN u.metadata IS NULL OR jsonb_typeof(u.metadata::jsonb) = 'null' THEN jsonb_build_object('settlement', jsonb_build_object(
    'status', p_rec_status::text, 'refund_share', p_rec_share::text, 'kept', p.amt)) WHEN jsonb_typeof(u.metadata::jsonb) = 'object' THEN u.metadata::jsonb || jsonb_build_object('settlement', jsonb_build_object(
    'status', p_rec_status::text, 'refund_share', p_rec_share::text, 'kept', p.amt)) ELSE u.metadata::jsonb END FROM p
  WHERE u.id = v_log.id AND u.status = 'reserved'
  RETURNING p.cs, p.ct, p.hs - p.cs AS rs, p.ht - p.ct AS rt),
ci AS (
  INSERT INTO reconcile_credit_transactions (id, user_id, job_id, type, amount, from_sub, from_topup, created_at)
  SELECT p_commit_id, r_user_id, p_j, 'COMMIT', cs + ct, cs, ct, p_now FROM cas RETURNING 1),
ri AS (
  INSERT INTO reconcile_credit_transactions (id, user_id, job_id, type, amount, from_sub, from_topup, created_at)
  SELECT p_release_id, r_user_id, p_j, 'RELEASE', rs + rt, rs, rt, p_now FROM cas
  WHERE rs + rt > 0 RETURNING 1),
lo AS (
  INSERT INTO reconcile_credit_lots (user_id, pool, kind, source_txn_id, amount, remaining_amount, created_at)
  SELECT r_user_id, v.pool, 'RELEASE', v.src, v.n, v.n, p_now
  FROM cas CROSS JOIN LATERAL (VALUES (1, 'sub', p_release_sub, cas.rs),
                                      (2, 'topup', p_release_topup, cas.rt)) AS v(o, pool, src, n)
  WHERE v.n > 0 ORDER BY v.o RETURNING 1),
bal AS (
  UPDATE reconcile_credit_balances b SET sub = b.sub + cas.rs, topup = b.topup + cas.rt, updated_at = p_now
  FROM cas WHERE b.user_id = r_user_id AND cas.rs + cas.rt > 0 RETURNING 1)
SELECT (SELECT count(*) FROM h), (SELECT hs + ht FROM h), (SELECT cs + ct FROM cas),
       (SELECT status FROM usage_logs WHERE id = v_log.id)
  INTO r_has_usage, r_held, r_committed, r_status;
END IF;
END;
"""),
    "reconcile_ledger_refund": (
        "p_j uuid, p_now timestamptz, p_usage_id text, p_refund_id text, p_refund_sub text, p_refund_topup text, OUT r_log_id text, OUT r_user_id uuid, OUT r_credits bigint, OUT r_meta jsonb, OUT r_reserved boolean, OUT r_has_usage bigint, OUT r_refunded boolean, OUT r_done bigint, OUT r_status text",
        """
DECLARE
  v_log record;
BEGIN
SELECT l.id, l.user_id, l.credits, l.metadata FROM usage_logs l
JOIN reconcile_credit_balances b ON b.user_id = l.user_id
WHERE l.job_id = p_j AND l.status = 'reserved' ORDER BY l.created_at LIMIT 1 FOR UPDATE OF b
  INTO v_log;
IF NOT FOUND THEN  -- no reserved log with its user's balance row
SELECT EXISTS (SELECT FROM usage_logs WHERE job_id = p_j AND status = 'reserved')
  INTO r_reserved;
  RETURN;
END IF;
r_log_id := v_log.id::text;
r_user_id := v_log.user_id;
r_credits := v_log.credits;
r_meta := v_log.metadata;
WITH t AS (
  SELECT MAX(from_sub) FILTER (WHERE id = p_usage_id) AS us,
         MAX(from_topup) FILTER (WHERE id = p_usage_id) AS ut,
         COALESCE(SUM(from_sub) FILTER (WHERE type = 'REFUND' AND id <> p_refund_id), 0) AS ls,
         COALESCE(SUM(from_topup) FILTER (WHERE type = 'REFUND' AND id <> p_refund_id), 0) AS lt,
         COALESCE(BOOL_OR(id = p_refund_id), false) AS refunded
  FROM reconcile_credit_transactions WHERE job_id = p_j),
h AS (
  SELECT GREATEST(0, us - ls)::bigint AS hs, GREATEST(0, ut - lt)::bigint AS ht, refunded
  FROM t WHERE us IS NOT NULL),
cas AS (
  UPDATE usage_logs u SET status = 'refunded' FROM h
  WHERE u.id = v_log.id AND u.status = 'reserved' AND NOT h.refunded
  RETURNING h.hs, h.ht),
ri AS (
  INSERT INTO reconcile_credit_transactions (id, user_id, job_id, type, amount, from_sub, from_topup, created_at)
  SELECT p_refund_id, r_user_id, p_j, 'REFUND', hs + ht, hs, ht, p_now FROM cas RETURNING 1),
lo AS (
  INSERT INTO reconcile_credit_lots (user_id, pool, kind, source_txn_id, amount, remaining_amount, created_at)
  SELECT r_user_id, v.pool, 'REFUND', v.src, v.n, v.n, p_now
  FROM cas CROSS JOIN LATERAL (VALUES (1, 'sub', p_refund_sub, cas.hs),
                                      (2, 'topup', p_refund_topup, cas.ht)) AS v(o, pool, src, n)
  WHERE v.n > 0 ORDER BY v.o RETURNING 1),
bal AS (
  UPDATE reconcile_credit_balances b SET sub = b.sub + cas.hs, topup = b.topup + cas.ht, updated_at = p_now
  FROM cas WHERE b.user_id = r_user_id RETURNING 1)
SELECT (SELECT count(*) FROM h), (SELECT refunded FROM h), (SELECT count(*) FROM cas),
       (SELECT status FROM usage_logs WHERE id = v_log.id)
  INTO r_has_usage, r_refunded, r_done, r_status;
END;
"""),
}


def _previous() -> dict[str, tuple[str, str]]:
    """Revision 0033's functions (frozen there)."""
    from alembic.script import ScriptDirectory

    from reconcile.migrations import LOCATION

    functions = ScriptDirectory(str(LOCATION)).get_revision("0033").module.FUNCTIONS
    return dict(functions)


def upgrade() -> None:
    set_lock_timeout()
    create_functions(FUNCTIONS)


def downgrade() -> None:
    set_lock_timeout()
    create_functions(_previous())
