-- Migration 13: the minimum commitments' true-up in billing.invoice_preview.
--
-- * billing.contract_versions: one row per version of a customer's contract (a
--   projection, projections/contracts.py, rebuilt from the history like the others): when
--   it takes effect and its minimums, in minor units: `minimums` the whole invoice's by
--   currency ({"USD": 2500}), `meter_minimums` each meter's by currency
--   ({"USD": {"gpt-4o.input_tokens": 100}}). A version that sets no minimum has a row
--   too: a version sets the whole contract, so it ends the minimums of the one before.
--   The versions set before this migration are read from the history here, up to the
--   projections' position, from which the projector goes on.
-- * billing.invoice_preview also shows, on each open invoice, the true-up lines closing
--   it now would add, and an `invoice_total` (and `invoice_lines`) that counts them. The
--   rule is domain.closing.true_ups, the one the close applies: the contract version in
--   force at the period's last moment; for each of its minimums of a meter in the
--   invoice's currency, `max(0, minimum - what that meter's lines bill)` on a line
--   `(minimum commitment) METER`; then `max(0, the invoice's minimum - every usage line
--   and those true-ups)` on a line `(minimum commitment)`; only usage lines count (the
--   `Prepaid credits applied` line does not); only amounts above 0 make a line. A true-up
--   line has no transactions: `transactions` 0, `exact_total` = `billed` = the amount,
--   `late` false, `model`, `quantity` and `tier` NULL.
--
-- Frozen: never edit this file once released; change the schema with a new file.

CREATE TABLE billing.contract_versions (
    customer_id    text        NOT NULL,
    contract_id    uuid        NOT NULL,
    version        integer     NOT NULL,
    effective_from timestamptz NOT NULL,
    minimums       jsonb       NOT NULL,
    meter_minimums jsonb       NOT NULL,
    set_at         timestamptz NOT NULL,
    CONSTRAINT contract_versions_pkey PRIMARY KEY (customer_id, version)
);

-- The versions set before this migration, from the history, up to where the projections
-- stand (the earliest position of any): the projector goes on from there, as it does for
-- the others, so nothing is applied twice or left out and none of it is behind.
INSERT INTO billing.projection_positions (name, xid, notification_id)
SELECT 'contract_versions', p.xid, p.notification_id
FROM (SELECT xid, notification_id FROM billing.projection_positions
      ORDER BY xid, notification_id LIMIT 1) p
ON CONFLICT (name) DO NOTHING;
INSERT INTO billing.projection_positions VALUES ('contract_versions', '0', 0)
ON CONFLICT (name) DO NOTHING;

INSERT INTO billing.contract_versions
SELECT convert_from(o.state, 'UTF8')::jsonb ->> 'customer_id', s.originator_id,
       (s.body ->> 'number')::integer, (s.body -> 'effective_from' ->> '_data_')::timestamptz,
       s.body -> 'minimums', coalesce(s.body -> 'meter_minimums', '{}'),
       (s.body -> 'timestamp' ->> '_data_')::timestamptz
FROM (SELECT e.originator_id, e.xid, e.notification_id,
             convert_from(e.state, 'UTF8')::jsonb AS body
      FROM public.billingledger_events e
      WHERE e.topic = 'domain.contract:Contract.Set') s
JOIN public.billingledger_events o
  ON o.originator_id = s.originator_id AND o.originator_version = 1
JOIN billing.projection_positions p ON p.name = 'contract_versions'
WHERE (s.xid, s.notification_id) <= (p.xid, p.notification_id);

GRANT SELECT, INSERT, UPDATE, DELETE ON billing.contract_versions TO billing_writer;
GRANT SELECT ON billing.contract_versions TO billing_reader, billing_auditor;

DROP VIEW billing.invoice_preview;
DROP FUNCTION billing.invoice_preview_now();

CREATE FUNCTION billing.invoice_preview_now() RETURNS TABLE (
    invoice_id uuid, customer_id text, currency text, period_start timestamptz,
    period_end timestamptz, close_deadline timestamptz, meter text, late boolean,
    transactions integer, exact_total numeric, billed bigint, invoice_total bigint,
    invoice_lines bigint, model text, quantity numeric, tier integer
) LANGUAGE sql STABLE AS $body$
WITH open_lines AS (
    SELECT i.invoice_id, i.customer_id, i.currency::text AS currency, i.period_start,
           i.period_end, i.close_deadline, l.meter, l.late_of_start IS NOT NULL AS late,
           l.transactions, l.exact_total, l.billed::bigint AS billed, l.model, l.quantity,
           l.tier
    FROM billing.invoices i
    JOIN billing.invoice_lines l
      ON l.customer_id = i.customer_id AND l.currency = i.currency
     AND l.period_start = i.period_start
    WHERE i.state = 'open'
),
open_invoices AS (
    SELECT DISTINCT invoice_id, customer_id, currency, period_start, period_end,
           close_deadline
    FROM open_lines
),
usage_billed AS (  -- what each open invoice's usage lines bill, by meter
    SELECT invoice_id, meter, sum(billed)::bigint AS billed
    FROM open_lines
    WHERE meter <> 'Prepaid credits applied' AND meter <> '(minimum commitment)'
      AND meter NOT LIKE '(minimum commitment) %'
    GROUP BY invoice_id, meter
),
terms AS (  -- the contract version in force at each period's last moment
    SELECT o.invoice_id, o.currency, v.minimums, v.meter_minimums
    FROM open_invoices o
    CROSS JOIN LATERAL (
        SELECT c.minimums, c.meter_minimums
        FROM billing.contract_versions c
        WHERE c.customer_id = o.customer_id
          AND c.effective_from <= o.period_end - interval '1 microsecond'
        ORDER BY c.effective_from DESC, c.version DESC
        LIMIT 1
    ) v
),
meter_true_ups AS (
    SELECT t.invoice_id, '(minimum commitment) ' || m.key AS meter,
           greatest(0, m.value::bigint - coalesce(u.billed, 0)) AS owed
    FROM terms t
    CROSS JOIN LATERAL jsonb_each_text(coalesce(t.meter_minimums -> t.currency, '{}')) m
    LEFT JOIN usage_billed u ON u.invoice_id = t.invoice_id AND u.meter = m.key
),
invoice_true_ups AS (
    SELECT t.invoice_id, '(minimum commitment)' AS meter,
           greatest(0, (t.minimums ->> t.currency)::bigint
               - coalesce((SELECT sum(u.billed) FROM usage_billed u
                           WHERE u.invoice_id = t.invoice_id), 0)
               - coalesce((SELECT sum(m.owed) FROM meter_true_ups m
                           WHERE m.invoice_id = t.invoice_id), 0))::bigint AS owed
    FROM terms t
    WHERE t.minimums ? t.currency
),
preview AS (
    SELECT invoice_id, customer_id, currency, period_start, period_end, close_deadline,
           meter, late, transactions, exact_total, billed, model, quantity, tier
    FROM open_lines
    UNION ALL
    SELECT o.invoice_id, o.customer_id, o.currency, o.period_start, o.period_end,
           o.close_deadline, u.meter, false, 0, u.owed::numeric, u.owed, NULL, NULL, NULL
    FROM (SELECT * FROM meter_true_ups UNION ALL SELECT * FROM invoice_true_ups) u
    JOIN open_invoices o ON o.invoice_id = u.invoice_id
    WHERE u.owed > 0
)
SELECT invoice_id, customer_id, currency, period_start, period_end, close_deadline, meter,
       late, transactions, exact_total, billed,
       sum(billed) OVER (PARTITION BY invoice_id)::bigint,
       count(*) OVER (PARTITION BY invoice_id),
       model, quantity, tier
FROM preview
$body$;

CREATE VIEW billing.invoice_preview AS SELECT * FROM billing.invoice_preview_now();

GRANT EXECUTE ON FUNCTION billing.invoice_preview_now()
    TO billing_writer, billing_reader, billing_auditor;
GRANT SELECT ON billing.invoice_preview TO billing_writer, billing_reader, billing_auditor;
