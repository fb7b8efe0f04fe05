-- Named environments (issue 63): the definition a task's first start used (image, setup, network,
-- its hash), beside the digest it resolved, so that a rescue or a resume builds and runs the same
-- one while the environment's definition changes for later tasks. Read by id from the queue only:
-- not in the task_rows view.
ALTER TABLE tasks ADD COLUMN environment_definition jsonb;
