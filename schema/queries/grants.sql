-- Least-privilege roles (schema/migrations/0008_privileges.sql).

-- name: grant_producer
SELECT awa.grant_producer(%(role)s)

-- name: grant_worker
SELECT awa.grant_worker(%(role)s)

-- name: revoke_privileges
SELECT awa.revoke_privileges(%(role)s)

-- name: role_privileges
-- What a role may do in the awa schema now: one row per object, with its
-- privileges (column privileges name their columns).
WITH r AS (SELECT oid FROM pg_roles WHERE rolname = %(role)s)
SELECT 'schema' AS kind, 'awa' AS name,
       string_agg(a.privilege_type, ', ' ORDER BY a.privilege_type) AS privileges
  FROM pg_namespace n CROSS JOIN LATERAL aclexplode(n.nspacl) a
 WHERE n.nspname = 'awa' AND a.grantee = (SELECT oid FROM r)
 GROUP BY 1, 2
UNION ALL
SELECT CASE c.relkind WHEN 'S' THEN 'sequence' WHEN 'v' THEN 'view' ELSE 'table' END,
       'awa.' || c.relname, string_agg(a.privilege_type, ', ' ORDER BY a.privilege_type)
  FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
 WHERE c.relnamespace = 'awa'::regnamespace AND a.grantee = (SELECT oid FROM r)
 GROUP BY 1, 2
UNION ALL
SELECT 'columns', 'awa.' || c.relname,
       string_agg(a.privilege_type || ' (' || t.attname || ')', ', ' ORDER BY a.privilege_type, t.attname)
  FROM pg_attribute t JOIN pg_class c ON c.oid = t.attrelid
 CROSS JOIN LATERAL aclexplode(t.attacl) a
 WHERE c.relnamespace = 'awa'::regnamespace AND a.grantee = (SELECT oid FROM r)
 GROUP BY 1, 2
UNION ALL
SELECT 'function', p.oid::regprocedure::text, 'EXECUTE'
  FROM pg_proc p CROSS JOIN LATERAL aclexplode(p.proacl) a
 WHERE p.pronamespace = 'awa'::regnamespace AND a.grantee = (SELECT oid FROM r)
   AND a.privilege_type = 'EXECUTE'
 ORDER BY 1, 2
