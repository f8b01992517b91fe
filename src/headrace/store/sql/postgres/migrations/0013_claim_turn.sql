-- Claims take turns. A claim first waits, at most `wait_ms` milliseconds, for the store's claim
-- turn (an advisory lock held until its transaction ends), so that concurrent claims do not
-- meet each other's candidates at the head of the ready queue and skip them row by row. A turn
-- not had in time (its holder stalled, or lost its link with the lock held) is gone without:
-- the claim goes on beside the others, as claims did before. Returns whether it had the turn.
CREATE FUNCTION claim_turn(wait_ms integer) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    was text := current_setting('lock_timeout');
BEGIN
    PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
    BEGIN
        PERFORM pg_advisory_xact_lock(1751411301, hashtext(current_schema()));
    EXCEPTION WHEN lock_not_available THEN
        PERFORM set_config('lock_timeout', was, true);
        RETURN false;
    END;
    PERFORM set_config('lock_timeout', was, true);
    RETURN true;
END
$$;
