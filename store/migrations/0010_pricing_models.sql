-- Migration 10: lines priced by quantity (tiers, packages, a flat fee per period).
--
-- * billing.invoice_lines gains the line's pricing `model` (`per_unit` for every line
--   priced record by record, which all lines before this migration were), its total
--   `quantity` (counted only on lines priced by quantity: NULL on per-unit lines) and the
--   `tier` (1, 2, ...) that quantity reaches when its price has tiers. Adding a column
--   with a constant default rewrites nothing.
-- * billing.invoice_preview shows them per line (the view is replaced: its function
--   returns three more columns).
--
-- Frozen: never edit this file once released; change the schema with a new file.

ALTER TABLE billing.invoice_lines
    ADD COLUMN model    text    NOT NULL DEFAULT 'per_unit',
    ADD COLUMN quantity numeric,
    ADD COLUMN tier     integer;

DROP VIEW billing.invoice_preview;
DROP FUNCTION billing.invoice_preview_now();

CREATE FUNCTION billing.invoice_preview_now() RETURNS TABLE (
    invoice_id uuid, customer_id text, currency text, period_start timestamptz,
    period_end timestamptz, close_deadline timestamptz, meter text, late boolean,
    transactions integer, exact_total numeric, billed bigint, invoice_total bigint,
    invoice_lines bigint, model text, quantity numeric, tier integer
) LANGUAGE sql STABLE AS $body$
SELECT i.invoice_id, i.customer_id, i.currency::text, i.period_start, i.period_end,
       i.close_deadline, l.meter, l.late_of_start IS NOT NULL, l.transactions,
       l.exact_total, l.billed,
       sum(l.billed) OVER (PARTITION BY i.invoice_id)::bigint,
       count(*) OVER (PARTITION BY i.invoice_id),
       l.model, l.quantity, l.tier
FROM billing.invoices i
JOIN billing.invoice_lines l
  ON l.customer_id = i.customer_id AND l.currency = i.currency
 AND l.period_start = i.period_start
WHERE i.state = 'open'
$body$;

CREATE VIEW billing.invoice_preview AS SELECT * FROM billing.invoice_preview_now();

GRANT EXECUTE ON FUNCTION billing.invoice_preview_now()
    TO billing_writer, billing_reader, billing_auditor;
GRANT SELECT ON billing.invoice_preview TO billing_writer, billing_reader, billing_auditor;
