-- A receipt of no send of its message (none of its requests had begun when it arrived) has its
-- own outcome, no_send. It was `superseded` with a reason beginning "of no send: ", which the
-- settle pass read; the outcome now says it and the reason keeps the rest.
UPDATE herald_receipts
   SET outcome = 'no_send', outcome_reason = substr(outcome_reason, 13)
 WHERE outcome = 'superseded' AND outcome_reason LIKE 'of no send: %';
