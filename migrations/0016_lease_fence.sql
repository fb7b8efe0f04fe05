-- A task holds a lease token only while it runs. Every transition out of 'running' already
-- cleared it; the constraint makes that a rule, so a fence is `id = $1 AND lease_token = $2`
-- and the primary key alone finds its row.
--
-- Why it matters: fenced as `id = $1 AND lease_token = $2 AND status = 'running'`, a write
-- could be planned as a scan of a whole partial index on the running tasks
-- (tasks_running_worker_idx, tasks_tenant_running_idx), filtered on id. Those indexes are
-- small, so the planner found them cheaper than the primary key whenever its statistics said
-- few tasks ran. Then each fenced write read every running task, and every entry for a task
-- that had stopped running and could not be cleaned up yet: while any snapshot was open (an
-- autovacuum ANALYZE holds one for a second or two, under its cost delay), those entries piled
-- up. In the benchmark's soak at 550 tasks/s, each autovacuum cycle slowed budget reservations
-- five-fold (1.2 to 6.6 ms a batch) and wait-mode answers to 0.6-2 s for 10-15 s a minute.
UPDATE tasks SET lease_token = NULL WHERE lease_token IS NOT NULL AND status <> 'running';
ALTER TABLE tasks ADD CONSTRAINT tasks_lease_only_while_running CHECK (lease_token IS NULL OR status = 'running');

-- budget_reserve_call (0008), fenced on the lease alone.
CREATE OR REPLACE FUNCTION budget_reserve_call(p_task uuid, p_lease uuid, p_prompt_usd numeric, p_out_usd numeric,
                                    p_prompt_tokens bigint, p_max_out integer, p_floor integer,
                                    d_usd_day numeric, d_usd_month numeric, d_tokens_day bigint, p_event jsonb,
                                    OUT result text, OUT lim text, OUT granted integer,
                                    OUT need_usd numeric, OUT need_tokens bigint,
                                    OUT want_usd numeric, OUT want_tokens bigint,
                                    OUT r_usd numeric, OUT r_tok bigint)
LANGUAGE plpgsql AS $$
DECLARE
    t record;
    r record;
    fl integer := least(p_floor, p_max_out);
    settled bigint := p_max_out;
    now_out bigint := p_max_out;
    settled_lim text;
    now_lim text;
    o bigint;
    s integer;
BEGIN
    SELECT id, tenant, cost_usd, input_tokens, output_tokens, max_cost_usd, max_tokens
      INTO t FROM tasks WHERE id = p_task AND lease_token = p_lease;
    IF NOT FOUND THEN result := 'lease_lost'; RETURN; END IF;
    -- The task's own limits (its only call in flight is this one: settled and now agree).
    IF t.max_cost_usd IS NOT NULL THEN
        o := budget_out(t.max_cost_usd - t.cost_usd, p_prompt_usd, p_out_usd, p_max_out);
        IF o < settled THEN settled := o; settled_lim := 'max_cost_usd'; END IF;
    END IF;
    IF t.max_tokens IS NOT NULL THEN
        o := budget_out((t.max_tokens - t.input_tokens - t.output_tokens)::numeric, p_prompt_tokens, 1, p_max_out);
        IF o < settled THEN settled := o; settled_lim := 'max_tokens'; END IF;
    END IF;
    now_out := settled; now_lim := settled_lim;
    IF EXISTS (SELECT 1 FROM tenants WHERE name = t.tenant AND (usd_per_day IS NOT NULL OR usd_per_month IS NOT NULL
               OR tokens_per_day IS NOT NULL OR d_usd_day IS NOT NULL OR d_usd_month IS NOT NULL OR d_tokens_day IS NOT NULL)) THEN
        PERFORM 1 FROM tenants WHERE name = t.tenant FOR UPDATE;
        SELECT * INTO r FROM budget_rooms(t.tenant, p_task, d_usd_day, d_usd_month, d_tokens_day);
        IF r.usd_day IS NOT NULL THEN
            o := budget_out(r.usd_day - r.settled_day, p_prompt_usd, p_out_usd, p_max_out);
            IF o < settled THEN settled := o; settled_lim := 'usd_per_day'; END IF;
            o := budget_out(r.usd_day - r.settled_day - r.held_usd, p_prompt_usd, p_out_usd, p_max_out);
            IF o < now_out THEN now_out := o; now_lim := 'usd_per_day'; END IF;
        END IF;
        IF r.usd_month IS NOT NULL THEN
            o := budget_out(r.usd_month - r.settled_month, p_prompt_usd, p_out_usd, p_max_out);
            IF o < settled THEN settled := o; settled_lim := 'usd_per_month'; END IF;
            o := budget_out(r.usd_month - r.settled_month - r.held_usd, p_prompt_usd, p_out_usd, p_max_out);
            IF o < now_out THEN now_out := o; now_lim := 'usd_per_month'; END IF;
        END IF;
        IF r.tok_day IS NOT NULL THEN
            o := budget_out((r.tok_day - r.settled_tok)::numeric, p_prompt_tokens, 1, p_max_out);
            IF o < settled THEN settled := o; settled_lim := 'tokens_per_day'; END IF;
            o := budget_out((r.tok_day - r.settled_tok - r.held_tok)::numeric, p_prompt_tokens, 1, p_max_out);
            IF o < now_out THEN now_out := o; now_lim := 'tokens_per_day'; END IF;
        END IF;
    END IF;
    IF settled < fl THEN
        result := 'refused'; lim := settled_lim; RETURN;
    END IF;
    granted := least(p_max_out, settled);
    IF now_out < granted THEN
        result := 'wait'; lim := now_lim;
        need_usd := p_prompt_usd + fl * p_out_usd; need_tokens := p_prompt_tokens + fl;
        want_usd := p_prompt_usd + granted * p_out_usd; want_tokens := p_prompt_tokens + granted;
        granted := NULL;
        RETURN;
    END IF;
    r_usd := p_prompt_usd + granted * p_out_usd;
    r_tok := p_prompt_tokens + granted;
    UPDATE tasks SET reserved_usd = reserved_usd + r_usd, reserved_tokens = reserved_tokens + r_tok,
                     last_event_seq = last_event_seq + (p_event IS NOT NULL)::int
     WHERE id = p_task AND lease_token = p_lease RETURNING last_event_seq INTO s;
    -- Fenced again: the lease may have changed hands while this waited for the tenant lock.
    IF NOT FOUND THEN result := 'lease_lost'; granted := NULL; r_usd := NULL; r_tok := NULL; RETURN; END IF;
    IF p_event IS NOT NULL THEN
        INSERT INTO task_events (task_id, seq, kind, data) VALUES (p_task, s, 'llm_call_started',
            p_event || jsonb_build_object('reserved_usd', r_usd, 'reserved_tokens', r_tok, 'max_tokens', granted));
    END IF;
    result := 'granted';
END $$;
