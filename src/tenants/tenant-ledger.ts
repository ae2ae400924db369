/**
 * @module Per-tenant accounts of session admission (docs/tenants.md): what
 * each tenant's active sessions hold (usage, tokens of footprint), the
 * service it received (token·seconds), and the virtual service that breaks
 * ties VTC-style. The session table is the only caller: it reports every
 * change of what a session holds, so usage changes in one place.
 */

import type { Band, TenantSpec } from "../config/scheduler-config.js";

/** Calls without a key (and without a trusted tenant header) belong to this tenant. */
export const DEFAULT_TENANT = "default";

/** Bands from the most to the least important; a lower rank goes first. */
export const BAND_RANK: Readonly<Record<Band, number>> = { protected: 0, standard: 1, sheddable: 2 };

/** A tenant's settings with every default filled in. */
export interface TenantPolicy {
  readonly name: string;
  readonly weight: number;
  readonly band: Band;
  readonly maxShare: number | undefined;
}

/** One tenant's running account. */
export interface TenantAccount {
  readonly policy: TenantPolicy;
  /** Sum of what its active sessions hold in their windows (tokens, or sessions for the session-count law). */
  usage: number;
  /** Usage integrated over time, token·ms (for `sluice_tenant_service_token_seconds_total`). */
  serviceTokenMs: number;
  /** Service divided by weight, lifted to the least of the others' when it starts asking again (no credit banked). */
  virtualService: number;
  /** When `usage` last changed, clock ms. */
  since: number;
  /** Sessions open (not closed) of this tenant. */
  sessions: number;
}

/** Tenants' accounts; a tenant is created on first use with the configured (or default) settings. */
export class TenantLedger {
  private readonly accounts = new Map<string, TenantAccount>();
  /** Tenants with at least one open session. */
  private openTenants = 0;

  constructor(private readonly specs: Readonly<Record<string, TenantSpec>> = {}) {}

  policy(name: string): TenantPolicy {
    return this.account(name).policy;
  }

  /** A tenant's policy without opening an account for it (a tenant seen only in one-off calls stays unlisted). */
  peekPolicy(name: string): TenantPolicy {
    return this.accounts.get(name)?.policy ?? this.policyOf(name);
  }

  private policyOf(name: string): TenantPolicy {
    const spec = Object.hasOwn(this.specs, name) ? this.specs[name] : undefined;
    return { name, weight: spec?.weight ?? 1, band: spec?.band ?? "standard", maxShare: spec?.max_share };
  }

  account(name: string): TenantAccount {
    let account = this.accounts.get(name);
    if (!account) {
      account = {
        policy: this.policyOf(name),
        usage: 0,
        serviceTokenMs: 0,
        virtualService: 0,
        since: 0,
        sessions: 0,
      };
      this.accounts.set(name, account);
    }
    return account;
  }

  /** What one of its sessions holds changed by `delta` at `now`. */
  addUsage(name: string, delta: number, now: number): void {
    if (delta === 0) return;
    const account = this.account(name);
    this.integrate(account, now);
    account.usage += delta;
    // Rounding of float footprints never leaves a ghost of usage behind.
    if (Math.abs(account.usage) < 1e-9) account.usage = 0;
  }

  /** A session of the tenant opened (+1) or closed (−1). */
  countSession(name: string, delta: 1 | -1): void {
    const account = this.account(name);
    const before = account.sessions;
    account.sessions += delta;
    if (before === 0 && account.sessions > 0) this.openTenants++;
    if (before > 0 && account.sessions === 0) this.openTenants--;
  }

  /** Whether sessions of more than one tenant are open: only then can shares differ from arrival order. */
  get shared(): boolean {
    return this.openTenants > 1;
  }

  /**
   * The tenant starts asking again after holding nothing: its virtual service
   * is lifted to the least among tenants holding something, so time spent
   * idle banks no credit (VTC).
   */
  lift(name: string, now: number): void {
    const account = this.account(name);
    if (account.usage > 0) return;
    let least = Number.POSITIVE_INFINITY;
    for (const other of this.accounts.values()) {
      if (other === account || other.usage <= 0) continue;
      this.integrate(other, now);
      least = Math.min(least, other.virtualService);
    }
    if (Number.isFinite(least)) account.virtualService = Math.max(account.virtualService, least);
  }

  /** Accounts with every service brought up to `now`. */
  snapshot(now: number): TenantAccount[] {
    for (const account of this.accounts.values()) this.integrate(account, now);
    return [...this.accounts.values()];
  }

  private integrate(account: TenantAccount, now: number): void {
    const elapsed = now - account.since;
    if (elapsed > 0 && account.usage > 0) {
      account.serviceTokenMs += account.usage * elapsed;
      account.virtualService += (account.usage * elapsed) / account.policy.weight;
    }
    account.since = now;
  }
}
