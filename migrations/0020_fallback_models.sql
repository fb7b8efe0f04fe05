-- Fallback models (issue 35): a tenant's default list, and the model that gave a task's final
-- answer. Both nullable, added without a rewrite.
ALTER TABLE tenants ADD COLUMN fallback_models text[];
ALTER TABLE tasks ADD COLUMN answered_model text;
