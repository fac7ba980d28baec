"""A comparable picture of the `awa` schema, read from the system catalogs.

`snapshot(conn)` reads every kind of object a migration can create or
change (relations, columns, constraints, indexes, sequences, types,
functions with their bodies and settings, triggers, views, privileges,
comments, rows) into plain dicts keyed by object name, free of OIDs and
timestamps, so two databases built different ways compare with `==`.
`differences(a, b)` says, object by object, how two snapshots differ.
"""
from __future__ import annotations

import difflib
from typing import Any, Dict, List, Optional

from psycopg2 import sql as pgsql

Snapshot = Dict[str, Dict[str, Dict[str, Any]]]

SCHEMA = "awa"


def _acl(column: str, kind: Optional[str] = None, owner: Optional[str] = None) -> str:
    """Effective privileges as sorted 'grantee=PRIVILEGE[*]/grantor' strings.

    A NULL ACL means the built-in default (for a function: EXECUTE to
    PUBLIC), so it is expanded with acldefault() before comparing: a
    database that revoked and re-granted compares equal to one that never
    touched the object, and one that differs in effect does not. Column
    privileges (kind None) have no default: NULL means none.
    """
    acl = f"coalesce({column}, acldefault({kind}, {owner}))" if kind else column
    return f"""(SELECT array_agg(format('%%s=%%s%%s/%%s',
                    CASE WHEN x.grantee = 0 THEN 'PUBLIC' ELSE pg_get_userbyid(x.grantee) END,
                    x.privilege_type, CASE WHEN x.is_grantable THEN '*' ELSE '' END,
                    pg_get_userbyid(x.grantor)) ORDER BY 1)
                  FROM aclexplode({acl}) x)"""


def _sorted(column: str) -> str:
    """A text[] option list in a stable order (the order has no meaning).

    Leaves out pg_attver: the PostgreSQL 15 build on the test machine
    stores a per-relation counter under that name in every column's options
    (system views' columns too), so it tells creation order, not schema.
    """
    return f"(SELECT array_agg(o ORDER BY o) FROM unnest({column}) o WHERE o NOT LIKE 'pg\\_attver=%%')"


# acldefault()'s object kind for a relation: sequences have their own defaults.
_RELATION_ACL_KIND = "(CASE WHEN c.relkind = 'S' THEN 's' ELSE 'r' END)::\"char\""

# Each query returns a first column `key` naming the object (unique within
# its category) and then one column per compared property.
CATALOG: Dict[str, str] = {
    "schema": f"""
        SELECT n.nspname AS key, pg_get_userbyid(n.nspowner) AS owner,
               {_acl('n.nspacl', "'n'", 'n.nspowner')} AS privileges
          FROM pg_namespace n WHERE n.nspname = %(schema)s""",

    "relations": f"""
        SELECT c.relname AS key, c.relkind AS kind, pg_get_userbyid(c.relowner) AS owner,
               {_acl('c.relacl', _RELATION_ACL_KIND, 'c.relowner')} AS privileges,
               c.relpersistence AS persistence, am.amname AS access_method,
               ts.spcname AS tablespace, {_sorted('c.reloptions')} AS options,
               c.relreplident AS replica_identity, c.relrowsecurity AS row_security,
               c.relforcerowsecurity AS force_row_security, c.relispartition AS is_partition,
               CASE WHEN c.relkind = 'p' THEN pg_get_partkeydef(c.oid) END AS partition_key,
               pg_get_expr(c.relpartbound, c.oid) AS partition_bound,
               (SELECT string_agg(p.relname, ', ' ORDER BY p.relname)
                  FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhparent
                 WHERE i.inhrelid = c.oid) AS parent
          FROM pg_class c
          JOIN pg_namespace n ON n.oid = c.relnamespace
          LEFT JOIN pg_am am ON am.oid = c.relam
          LEFT JOIN pg_tablespace ts ON ts.oid = c.reltablespace
         WHERE n.nspname = %(schema)s""",

    # position: the job tables share their column order (rows move between
    # them with INSERT ... SELECT, the awa.jobs view reads `*`), so it counts.
    "columns": f"""
        SELECT c.relname || '.' || a.attname AS key,
               row_number() OVER (PARTITION BY c.oid ORDER BY a.attnum) AS position,
               format_type(a.atttypid, a.atttypmod) AS type, a.attnotnull AS not_null,
               pg_get_expr(d.adbin, d.adrelid) AS default, a.attidentity AS identity,
               a.attgenerated AS generated, a.attislocal AS is_local,
               a.attinhcount AS inherited_from, a.attstattarget AS statistics_target,
               a.attstorage AS storage, a.attcompression AS compression,
               CASE WHEN a.attcollation <> t.typcollation THEN co.collname END AS collation,
               {_sorted('a.attoptions')} AS options,
               {_acl('a.attacl')} AS privileges
          FROM pg_attribute a
          JOIN pg_class c ON c.oid = a.attrelid
          JOIN pg_namespace n ON n.oid = c.relnamespace
          JOIN pg_type t ON t.oid = a.atttypid
          LEFT JOIN pg_collation co ON co.oid = a.attcollation
          LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
         WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'c')
           AND a.attnum > 0 AND NOT a.attisdropped""",

    "constraints": """
        SELECT coalesce(r.relname, ty.typname) || '.' || con.conname AS key,
               con.contype AS kind, pg_get_constraintdef(con.oid, true) AS definition,
               con.condeferrable AS deferrable, con.condeferred AS deferred,
               con.convalidated AS validated, con.conislocal AS is_local,
               con.coninhcount AS inherited_from, con.connoinherit AS no_inherit,
               ix.relname AS index
          FROM pg_constraint con
          JOIN pg_namespace n ON n.oid = con.connamespace
          LEFT JOIN pg_class r ON r.oid = con.conrelid
          LEFT JOIN pg_type ty ON ty.oid = con.contypid
          LEFT JOIN pg_class ix ON ix.oid = con.conindid
         WHERE n.nspname = %(schema)s""",

    "indexes": """
        SELECT ic.relname AS key, pg_get_indexdef(i.indexrelid) AS definition,
               i.indisunique AS is_unique, i.indisprimary AS is_primary,
               i.indisexclusion AS is_exclusion, i.indimmediate AS immediate,
               i.indisclustered AS clustered, i.indisvalid AS valid,
               i.indisreplident AS replica_identity
          FROM pg_index i
          JOIN pg_class ic ON ic.oid = i.indexrelid
          JOIN pg_namespace n ON n.oid = ic.relnamespace
         WHERE n.nspname = %(schema)s""",

    "sequences": """
        SELECT c.relname AS key, format_type(s.seqtypid, NULL) AS type, s.seqstart AS start,
               s.seqincrement AS increment, s.seqmin AS min, s.seqmax AS max,
               s.seqcache AS cache, s.seqcycle AS cycle, ps.last_value AS last_value,
               (SELECT oc.relname || '.' || oa.attname
                  FROM pg_depend dep
                  JOIN pg_class oc ON oc.oid = dep.refobjid
                  JOIN pg_attribute oa ON oa.attrelid = dep.refobjid AND oa.attnum = dep.refobjsubid
                 WHERE dep.classid = 'pg_class'::regclass AND dep.objid = c.oid
                   AND dep.refclassid = 'pg_class'::regclass
                   AND dep.deptype IN ('a', 'i')) AS owned_by
          FROM pg_sequence s
          JOIN pg_class c ON c.oid = s.seqrelid
          JOIN pg_namespace n ON n.oid = c.relnamespace
          LEFT JOIN pg_sequences ps ON ps.schemaname = n.nspname AND ps.sequencename = c.relname
         WHERE n.nspname = %(schema)s""",

    # Enum labels in their sort order: an enum's order is part of its meaning.
    "types": f"""
        SELECT t.typname AS key, t.typtype AS kind, t.typcategory AS category,
               pg_get_userbyid(t.typowner) AS owner,
               {_acl('t.typacl', "'T'", 't.typowner')} AS privileges,
               r.relname AS relation, nullif(t.typelem, 0)::regtype::text AS element,
               nullif(t.typbasetype, 0)::regtype::text AS base_type, t.typnotnull AS not_null,
               t.typdefault AS default,
               (SELECT array_agg(e.enumlabel ORDER BY e.enumsortorder)
                  FROM pg_enum e WHERE e.enumtypid = t.oid) AS labels
          FROM pg_type t
          JOIN pg_namespace n ON n.oid = t.typnamespace
          LEFT JOIN pg_class r ON r.oid = t.typrelid
         WHERE n.nspname = %(schema)s""",

    # pg_get_functiondef: signature, defaults, language, volatility, SECURITY
    # DEFINER, SET clauses and the whole body, as the server prints them.
    "functions": f"""
        SELECT p.oid::regprocedure::text AS key, p.prokind AS kind, l.lanname AS language,
               pg_get_userbyid(p.proowner) AS owner,
               {_acl('p.proacl', "'f'", 'p.proowner')} AS privileges,
               p.prosecdef AS security_definer, p.provolatile AS volatility,
               p.proisstrict AS strict, p.proleakproof AS leakproof,
               p.proparallel AS parallel, p.procost AS cost, p.prorows AS rows,
               p.proconfig AS settings,
               CASE WHEN p.prokind IN ('f', 'p') THEN pg_get_functiondef(p.oid) END AS definition
          FROM pg_proc p
          JOIN pg_namespace n ON n.oid = p.pronamespace
          JOIN pg_language l ON l.oid = p.prolang
         WHERE n.nspname = %(schema)s""",

    # Internal triggers (those behind foreign keys) carry OIDs in their
    # names; their constraints are compared instead.
    "triggers": """
        SELECT c.relname || '.' || tg.tgname AS key, pg_get_triggerdef(tg.oid, true) AS definition,
               tg.tgenabled AS enabled,
               (SELECT pc.relname FROM pg_trigger pt JOIN pg_class pc ON pc.oid = pt.tgrelid
                 WHERE pt.oid = tg.tgparentid) AS cloned_from
          FROM pg_trigger tg
          JOIN pg_class c ON c.oid = tg.tgrelid
          JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = %(schema)s AND NOT tg.tgisinternal""",

    "views": """
        SELECT c.relname AS key, pg_get_viewdef(c.oid, true) AS definition
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = %(schema)s AND c.relkind IN ('v', 'm')""",

    "rules": """
        SELECT c.relname || '.' || r.rulename AS key, pg_get_ruledef(r.oid, true) AS definition,
               r.ev_enabled AS enabled
          FROM pg_rewrite r
          JOIN pg_class c ON c.oid = r.ev_class
          JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = %(schema)s AND r.rulename <> '_RETURN'""",

    "policies": """
        SELECT c.relname || '.' || pol.polname AS key, pol.polcmd AS command,
               pol.polpermissive AS permissive,
               (SELECT array_agg(CASE WHEN x = 0 THEN 'PUBLIC' ELSE pg_get_userbyid(x) END ORDER BY 1)
                  FROM unnest(pol.polroles) x) AS roles,
               pg_get_expr(pol.polqual, pol.polrelid) AS using_expression,
               pg_get_expr(pol.polwithcheck, pol.polrelid) AS check_expression
          FROM pg_policy pol
          JOIN pg_class c ON c.oid = pol.polrelid
          JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = %(schema)s""",

    "statistics": """
        SELECT s.stxname AS key, pg_get_statisticsobjdef(s.oid) AS definition
          FROM pg_statistic_ext s JOIN pg_namespace n ON n.oid = s.stxnamespace
         WHERE n.nspname = %(schema)s""",

    "default_privileges": """
        SELECT concat_ws(' ', pg_get_userbyid(d.defaclrole), coalesce(n.nspname, '(every schema)'),
                         d.defaclobjtype::text) AS key,
               d.defaclacl::text[] AS privileges
          FROM pg_default_acl d LEFT JOIN pg_namespace n ON n.oid = d.defaclnamespace
         WHERE n.nspname = %(schema)s OR d.defaclnamespace = 0""",

    "comments": """
        SELECT o.type || ' ' || o.identity AS key, d.description AS comment
          FROM pg_description d, LATERAL pg_identify_object(d.classoid, d.objoid, d.objsubid) o
         WHERE o.schema = %(schema)s OR (o.type = 'schema' AND o.identity = %(schema)s)""",

    "extensions": """
        SELECT e.extname AS key, e.extversion AS version, n.nspname AS schema
          FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace""",

    # ALTER DATABASE / ALTER ROLE ... SET for this database.
    "database_settings": """
        SELECT CASE WHEN s.setrole = 0 THEN '(every role)' ELSE pg_get_userbyid(s.setrole) END AS key,
               s.setconfig AS settings
          FROM pg_db_role_setting s
         WHERE s.setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())""",
}

# Rows, per table: timestamps (created_at = now() and the like) left out.
_TABLES = """
    SELECT c.relname,
           array_agg(a.attname::text ORDER BY a.attnum)
               FILTER (WHERE a.atttypid IN ('timestamptz'::regtype, 'timestamp'::regtype))
      FROM pg_class c
      JOIN pg_namespace n ON n.oid = c.relnamespace
      JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
     WHERE n.nspname = %(schema)s AND c.relkind = 'r'
     GROUP BY c.relname ORDER BY c.relname"""

_ROWS = "SELECT coalesce(array_agg(r ORDER BY r), '{{}}') FROM (SELECT (to_jsonb(t) - %(drop)s::text[])::text AS r FROM {} t) x"


def snapshot(conn: Any) -> Snapshot:
    """Every compared property of the awa schema in `conn`'s database."""
    found: Snapshot = {}
    with conn.cursor() as cur:
        for category, query in CATALOG.items():
            cur.execute(query, {"schema": SCHEMA})
            names = [column.name for column in cur.description]
            objects: Dict[str, Dict[str, Any]] = {}
            for row in cur.fetchall():
                key = row[0]
                assert key not in objects, f"{category}: two objects named {key!r}"
                objects[key] = dict(zip(names[1:], row[1:]))
            found[category] = objects
        cur.execute(_TABLES, {"schema": SCHEMA})
        rows: Dict[str, Dict[str, Any]] = {}
        for table, timestamps in cur.fetchall():
            cur.execute(pgsql.SQL(_ROWS).format(pgsql.Identifier(SCHEMA, table)),
                        {"drop": timestamps or []})
            rows[table] = {"rows": cur.fetchone()[0]}
        found["rows"] = rows
    conn.rollback()
    return found


def _describe(value: Any, label_a: str, label_b: str, other: Any) -> List[str]:
    if isinstance(value, str) and isinstance(other, str) and "\n" in value + other:
        return ["      " + line.rstrip("\n") for line in difflib.unified_diff(
            value.splitlines(), other.splitlines(), label_a, label_b, lineterm="", n=2)]
    return [f"      {label_a}: {value!r}", f"      {label_b}: {other!r}"]


def differences(a: Snapshot, b: Snapshot, label_a: str = "a", label_b: str = "b") -> List[str]:
    """Readable lines naming each object that differs between two snapshots and how."""
    lines: List[str] = []
    for category in sorted(set(a) | set(b)):
        left, right = a.get(category, {}), b.get(category, {})
        for key in sorted(set(left) | set(right)):
            if key not in right:
                lines.append(f"{category}: {key} exists only in {label_a}")
            elif key not in left:
                lines.append(f"{category}: {key} exists only in {label_b}")
            elif left[key] != right[key]:
                lines.append(f"{category}: {key} differs")
                for field in sorted(set(left[key]) | set(right[key])):
                    mine, theirs = left[key].get(field), right[key].get(field)
                    if mine != theirs:
                        lines.append(f"    {field}:")
                        lines.extend(_describe(mine, label_a, label_b, theirs))
    return lines
