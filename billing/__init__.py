"""Money: the ledger (reserve, settle), integer nano-USD, concurrency slots, rate limits, the agent meter, storage quota, deadlines."""
