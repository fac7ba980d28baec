-- Reserved: 0029 is the workflows branch's migration (issue 38). This file
-- only keeps the numbers contiguous on the limits branch so that its 0030
-- applies; drop it (and its line in current.sql's version list) when the
-- workflows migration is merged.
SELECT 1
