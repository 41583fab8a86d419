"""Starting a run: the embedded broker and its archived log, start-up checks, the launcher of
a run's processes (locally or on Ray), and its progress output."""
