"""Results for people and CI: JUnit XML, the SQLite history store, the static dashboard, text tables."""
