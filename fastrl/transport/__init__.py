"""Transport between processes: the messages, the queues and mailbox that carry them, process
helpers (lifelines, queue-lock repair) and the allocator tuning."""
