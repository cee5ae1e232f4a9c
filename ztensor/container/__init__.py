"""The zTensor container itself: footer, manifest (the general path and the
column fast path), v0.1 and v2, the Reader and its batch/into paths, the Writer,
streamed writes and edits."""
