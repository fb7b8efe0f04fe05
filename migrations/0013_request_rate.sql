-- Per-tenant API request rate (counted per process): requests per second and a burst.
ALTER TABLE tenants ADD COLUMN requests_per_second double precision, ADD COLUMN request_burst integer;
