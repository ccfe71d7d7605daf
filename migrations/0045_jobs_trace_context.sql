-- The W3C trace context of a job's submit request (issue 16 item 5): the `traceparent` of the
-- submit span, continued by the workers that claim the job's tasks. One nullable column on jobs,
-- not on tasks: the claim reads the job rows anyway, and the completion path never reads it.
-- NULL when tracing was off at submit.
-- transactional: false
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS trace_context TEXT;
