-- Budgets that can be spent: a call that does not fit while other calls' reservations are held,
-- but would fit once they settle, waits (its task goes back to the queue, `waiting_for`), and a
-- call that cannot have its whole output cap may go ahead with a lower one.

ALTER TABLE tasks
    ADD COLUMN waiting_for      text,             -- 'budget': queued, waiting for reservations to settle
    ADD COLUMN waiting_since    timestamptz,
    ADD COLUMN wait_need_usd    numeric(20, 10),  -- its smallest call (prompt + floor output)
    ADD COLUMN wait_need_tokens bigint,
    ADD COLUMN wait_want_usd    numeric(20, 10),  -- the call it waits to make (the output the settled room allows)
    ADD COLUMN wait_want_tokens bigint,
    ADD COLUMN wait_deadline    timestamptz;      -- its time limit: a wait past it ends the task
-- Waiters of a tenant, oldest first; probed by every settlement (an empty index, mostly).
CREATE INDEX tasks_waiting_idx ON tasks (tenant, id) WHERE waiting_for IS NOT NULL;

-- What a tenant may still spend, per limit: the settled spend, and the reservations others hold.
CREATE FUNCTION budget_rooms(p_tenant text, p_task uuid, d_usd_day numeric, d_usd_month numeric, d_tokens_day bigint,
                             OUT usd_day numeric, OUT usd_month numeric, OUT tok_day bigint,
                             OUT settled_day numeric, OUT settled_month numeric, OUT settled_tok bigint,
                             OUT held_usd numeric, OUT held_tok bigint)
LANGUAGE plpgsql AS $$
DECLARE
    today date := (now() AT TIME ZONE 'UTC')::date;
BEGIN
    SELECT coalesce(t.usd_per_day, d_usd_day), coalesce(t.usd_per_month, d_usd_month), coalesce(t.tokens_per_day, d_tokens_day)
      INTO usd_day, usd_month, tok_day FROM tenants t WHERE t.name = p_tenant;
    IF usd_day IS NULL AND usd_month IS NULL AND tok_day IS NULL THEN RETURN; END IF;
    SELECT coalesce(sum(cost_usd) FILTER (WHERE day = today), 0), coalesce(sum(cost_usd), 0),
           coalesce(sum(input_tokens + output_tokens) FILTER (WHERE day = today), 0)
      INTO settled_day, settled_month, settled_tok
      FROM usage_daily WHERE tenant = p_tenant AND day >= date_trunc('month', today)::date;
    SELECT coalesce(sum(reserved_usd), 0), coalesce(sum(reserved_tokens), 0) INTO held_usd, held_tok
      FROM tasks WHERE tenant = p_tenant AND status = 'running' AND id IS DISTINCT FROM p_task;
END $$;

-- Output tokens that `room` (USD or tokens) leaves after the prompt, at `per_out` a token:
-- -1 when not even the prompt fits; `cap` when output costs nothing.
CREATE FUNCTION budget_out(room numeric, prompt numeric, per_out numeric, cap integer) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN room IS NULL THEN cap
                WHEN room - prompt < 0 THEN -1
                WHEN per_out <= 0 THEN cap
                ELSE least(floor((room - prompt) / per_out), cap) END::bigint
$$;

-- Reserve one provider call against the task's and the tenant's limits, atomically, and append
-- its `llm_call_started` event (with what was granted). The call asks for `p_max_out` output
-- tokens and can do with `p_floor`. With a limit's room counted after the settled spend only
-- ("settled") and after others' reservations too ("now"):
--   granted   the call fits now, with min(p_max_out, what settled room allows) output tokens
--   wait      it fits the settled room but not now: others' reservations must settle first
--   refused   not even the floor fits the settled room (the limit's name says which)
--   lease_lost
-- A tenant with spend limits is locked (its row) while its spend is checked.
CREATE FUNCTION budget_reserve_call(p_task uuid, p_lease uuid, p_prompt_usd numeric, p_out_usd numeric,
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
      INTO t FROM tasks WHERE id = p_task AND lease_token = p_lease AND status = 'running';
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
     WHERE id = p_task AND lease_token = p_lease AND status = 'running' RETURNING last_event_seq INTO s;
    -- Fenced again: the lease may have changed hands while this waited for the tenant lock.
    IF NOT FOUND THEN result := 'lease_lost'; granted := NULL; r_usd := NULL; r_tok := NULL; RETURN; END IF;
    IF p_event IS NOT NULL THEN
        INSERT INTO task_events (task_id, seq, kind, data) VALUES (p_task, s, 'llm_call_started',
            p_event || jsonb_build_object('reserved_usd', r_usd, 'reserved_tokens', r_tok, 'max_tokens', granted));
    END IF;
    result := 'granted';
END $$;

-- Wake a tenant's budget waiters, oldest first, while the call each waits to make fits what is
-- free now (no more than the settled room: with less, its call is granted less), and any whose
-- smallest call no longer fits even the settled room (its run ends it). The oldest waiter that
-- does not fit yet holds the line. Returns the woken tasks and how long each waited; tells the
-- workers (NOTIFY) when it woke any.
CREATE FUNCTION budget_wake(p_tenant text, d_usd_day numeric, d_usd_month numeric, d_tokens_day bigint)
RETURNS TABLE (task_id uuid, waited_seconds float8)
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    w record;
    free_day numeric;
    free_month numeric;
    free_tok bigint;
    doomed boolean;
    fits boolean;
    woke integer := 0;
BEGIN
    PERFORM 1 FROM tenants WHERE name = p_tenant FOR UPDATE;
    SELECT * INTO r FROM budget_rooms(p_tenant, NULL, d_usd_day, d_usd_month, d_tokens_day);
    free_day := r.usd_day - r.settled_day - r.held_usd;
    free_month := r.usd_month - r.settled_month - r.held_usd;
    free_tok := r.tok_day - r.settled_tok - r.held_tok;
    FOR w IN SELECT id, wait_need_usd AS nu, wait_need_tokens AS nt, waiting_since,
                    least(wait_want_usd, r.usd_day - r.settled_day) AS wd,
                    least(wait_want_usd, r.usd_month - r.settled_month) AS wm,
                    least(wait_want_tokens, r.tok_day - r.settled_tok) AS wt
             FROM tasks WHERE tenant = p_tenant AND status = 'queued' AND waiting_for = 'budget' ORDER BY id LOOP
        doomed := (r.usd_day IS NOT NULL AND r.usd_day - r.settled_day < w.nu)
               OR (r.usd_month IS NOT NULL AND r.usd_month - r.settled_month < w.nu)
               OR (r.tok_day IS NOT NULL AND r.tok_day - r.settled_tok < w.nt);
        fits := (free_day IS NULL OR free_day >= w.wd) AND (free_month IS NULL OR free_month >= w.wm)
               AND (free_tok IS NULL OR free_tok >= w.wt);
        IF NOT doomed AND NOT fits THEN EXIT; END IF;
        IF fits AND NOT doomed THEN
            free_day := free_day - w.wd; free_month := free_month - w.wm; free_tok := free_tok - w.wt;
        END IF;
        UPDATE tasks SET waiting_for = NULL WHERE id = w.id;
        task_id := w.id;
        waited_seconds := extract(epoch FROM now() - w.waiting_since);
        woke := woke + 1;
        RETURN NEXT;
    END LOOP;
    IF woke > 0 THEN PERFORM pg_notify('subagentd_queued', ''); END IF;
END $$;
