"""Rendering for people: tables, Markdown, HTML and plots. A leaf: it imports nothing else of the package."""
