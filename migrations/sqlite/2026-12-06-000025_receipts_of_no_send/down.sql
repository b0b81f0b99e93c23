UPDATE herald_receipts
   SET outcome = 'superseded', outcome_reason = 'of no send: ' || COALESCE(outcome_reason, '')
 WHERE outcome = 'no_send';
