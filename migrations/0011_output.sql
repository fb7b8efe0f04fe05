-- Structured results: the final answer's value when the task has an output_schema.
ALTER TABLE tasks ADD COLUMN output jsonb;
