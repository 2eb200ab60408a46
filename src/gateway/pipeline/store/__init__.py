"""Stored responses and conversations: one async interface, several backends."""
