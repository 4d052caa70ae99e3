-- The intermediate CAs between an enrolled EK CA (the anchor) and the EK
-- certificates it admits, as an operator enrolled them: DER certificates
-- one after another, NULL for none.
ALTER TABLE machine_enrolments ADD COLUMN ca_intermediates BYTEA;
