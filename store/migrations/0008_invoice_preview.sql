-- Migration 8: what each open period's invoice would be now.
--
-- `billing.invoice_preview` has one row per line of every open invoice (its period not
-- closed yet): the line's meter, its transactions, its exact total and billed amount
-- (the exact total rounded once, half up), whether it holds late usage of an earlier
-- period, and the invoice's total so far (the sum of its lines' billed amounts, which
-- is what Stripe will be asked to finalize). It is read from the read models alone,
-- without calling Stripe: `billing-ledger invoices preview` shows it.
--
-- Like queue health, the view wraps a SQL function whose body is bound when it runs, so
-- a projection rebuild can drop and rename the tables it reads without touching it.
--
-- Frozen: never edit this file once released; change the schema with a new file.

CREATE FUNCTION billing.invoice_preview_now() RETURNS TABLE (
    invoice_id uuid, customer_id text, currency text, period_start timestamptz,
    period_end timestamptz, close_deadline timestamptz, meter text, late boolean,
    transactions integer, exact_total numeric, billed bigint, invoice_total bigint,
    invoice_lines bigint
) LANGUAGE sql STABLE AS $body$
SELECT i.invoice_id, i.customer_id, i.currency::text, i.period_start, i.period_end,
       i.close_deadline, l.meter, l.late_of_start IS NOT NULL, l.transactions,
       l.exact_total, l.billed,
       sum(l.billed) OVER (PARTITION BY i.invoice_id)::bigint,
       count(*) OVER (PARTITION BY i.invoice_id)
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
