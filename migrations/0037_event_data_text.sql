-- An event row's own event as compact JSON text too (#47). Since 0033 a row's earlier events are
-- `json` (the text the service writes), but its last one stayed in `data`, a `jsonb`: the larger
-- of the two forms for the small objects events are (an `llm_call_finished` is 246 bytes as
-- jsonb, 168 as text), and nothing queries inside it but the view below. The service now writes
-- the events it makes in Rust to `data_text` (`json`) and leaves `data` NULL; the few it builds in
-- SQL (`created`, `claimed`, `rescued`, ...) stay in `data`. A row has one or the other.
--
-- Changing `data`'s type would rewrite every partition. A new column without a default, and
-- dropping a NOT NULL, change only the catalog: instant, on every partition. Rows written before
-- stay as they are and read as before.
--
-- A binary of the release before reads `data` as NOT NULL: stop it before this one writes
-- (docs/upgrades.md).
ALTER TABLE task_events ADD COLUMN data_text json;
ALTER TABLE task_events ALTER COLUMN data DROP NOT NULL;

DO $$
BEGIN
    ALTER TABLE task_events ALTER COLUMN data_text SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported OR invalid_parameter_value THEN
    RAISE NOTICE 'lz4 is not available: event data keeps pglz';
END $$;

CREATE OR REPLACE VIEW task_event_log AS
SELECT e.task_id, x.seq, x.kind, x.data, e.created_at, e.seq AS row_seq
FROM task_events e
CROSS JOIN LATERAL (
    SELECT e.seq - json_array_length(e.earlier) - 1 + a.n::int AS seq, a.p->>0 AS kind, (a.p->1)::jsonb AS data
    FROM json_array_elements(e.earlier) WITH ORDINALITY AS a(p, n)
    UNION ALL
    SELECT e.seq, e.kind, coalesce(e.data, e.data_text::jsonb)
) x;

-- A call's `llm_call_started`, written by `budget_reserve_call` with what was reserved: its event
-- now comes as compact text (`p_event json`, without the grant's three fields), and what was
-- granted is added to it as text. The function is made again from its own definition (as 0029
-- did), with that one insert changed.
DO $$
DECLARE
    f regprocedure := 'budget_reserve_call(uuid, uuid, numeric, numeric, bigint, integer, integer, numeric,
                                           numeric, bigint, jsonb)'::regprocedure;
    def text := replace(pg_get_functiondef(f), 'p_event jsonb', 'p_event json');
    made text;
BEGIN
    made := regexp_replace(def,
        'INSERT INTO task_events \(task_id, seq, kind, data\) VALUES \(p_task, s, ''llm_call_started'',\s*p_event \|\| jsonb_build_object\(''reserved_usd'', r_usd, ''reserved_tokens'', r_tok, ''max_tokens'', granted\)\);',
        'INSERT INTO task_events (task_id, seq, kind, data, data_text) VALUES (p_task, s, ''llm_call_started'', NULL,
            (CASE WHEN p_event::text = ''{}'' THEN ''{'' ELSE left(p_event::text, -1) || '','' END
             || ''"reserved_usd":'' || r_usd || '',"reserved_tokens":'' || r_tok || '',"max_tokens":'' || granted
             || ''}'')::json);');
    IF made = def THEN
        RAISE EXCEPTION 'budget_reserve_call: its llm_call_started insert is not the one this migration knows';
    END IF;
    EXECUTE 'DROP FUNCTION ' || f::text;
    EXECUTE made;
END $$;
