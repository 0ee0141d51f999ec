-- Argo CD health check of a quotaplane.io QuotaPlane (argocd-cm key
-- resource.customizations.health.quotaplane.io_QuotaPlane; see
-- argocd-cm.yaml beside this file and docs/gitops.md).
--
-- Healthy     the manager observed this generation, the plane is valid and
--             published (Ready=True), no quota object of the namespace is
--             rejected or held, and every enforcer runs the published
--             version (Enforced=True).
-- Progressing the manager has not observed this generation yet, or the
--             fleet is loading the version (Enforced=False: RollingOut,
--             NoEnforcers, NotPublished).
-- Degraded    something needs a fix: the plane is invalid, held or a
--             duplicate, or Redis does not take the policy (Ready=False;
--             the message says what to do), quota objects are rejected or
--             held (status.rejectedObjects, heldObjects; their own Ready
--             conditions say why), or the enforcers' reports cannot be
--             read (Enforced=Unknown: Redis is away).
local hs = {}

local function condition(conditions, type)
  if conditions == nil then
    return nil
  end
  for _, c in ipairs(conditions) do
    if c.type == type then
      return c
    end
  end
  return nil
end

local function current(c, generation)
  return c ~= nil and (c.observedGeneration == nil or c.observedGeneration == generation)
end

local generation = obj.metadata.generation
local status = obj.status
if status == nil or status.observedGeneration == nil or status.observedGeneration ~= generation then
  hs.status = "Progressing"
  hs.message = "waiting for the quotaplane manager to compile generation " .. tostring(generation)
  return hs
end

local ready = condition(status.conditions, "Ready")
if not current(ready, generation) then
  hs.status = "Progressing"
  hs.message = "waiting for the quotaplane manager to compile generation " .. tostring(generation)
  return hs
end
if ready.status ~= "True" then
  hs.status = "Degraded"
  hs.message = (ready.reason or "NotReady") .. ": " .. (ready.message or "")
  return hs
end

local rejected = status.rejectedObjects or 0
local held = status.heldObjects or 0
if rejected > 0 or held > 0 then
  hs.status = "Degraded"
  hs.message = string.format("%d quota objects rejected and %d held (an invalid edit whose last valid version stays in force): see their Ready conditions", rejected, held)
  return hs
end

local enforced = condition(status.conditions, "Enforced")
if not current(enforced, generation) then
  hs.status = "Progressing"
  hs.message = "published as version " .. tostring(status.publishedVersion) .. "; waiting for the enforcers' reports"
  return hs
end
if enforced.status == "True" then
  hs.status = "Healthy"
elseif enforced.status == "Unknown" then
  hs.status = "Degraded"
else
  hs.status = "Progressing"
end
hs.message = (enforced.reason or "") .. ": " .. (enforced.message or "")
return hs
