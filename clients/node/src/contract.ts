/** The version of the gate contract (docs/contract.md) this producer speaks; sent with
 * every gate call (ARGV[4] `<version>:`), refused by a gate of another version. */
export const CONTRACT_VERSION = 1;
