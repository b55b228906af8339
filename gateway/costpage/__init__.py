"""The built-in cost page (static HTML + vanilla JS, inline SVG charts) served at /dashboard."""
