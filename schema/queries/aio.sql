-- Statements only the asyncio seam (awa_pool/api/aio_drivers.py) runs; the
-- operations themselves send the same queries as the synchronous API.

-- name: json_codec_probe
-- A jsonb value whose text and decoded forms differ: through asyncpg's own
-- codec it comes back as the text '"probe"', through a codec the caller set
-- that decodes (SQLAlchemy's asyncpg dialect sets one) as 'probe'.
SELECT '"probe"'::jsonb

-- name: start_transaction
-- SQLAlchemy's asyncpg adapter sends its BEGIN with the first statement it
-- runs; this is that statement when an awa_pool.aio call comes first.
SELECT 1
