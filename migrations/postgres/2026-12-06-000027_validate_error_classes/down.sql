-- A validated constraint cannot be made NOT VALID again; nothing to undo.
SELECT 1;
